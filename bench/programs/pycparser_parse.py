"""pycparser parsing a generated C translation unit (functions with loops, conditions, structs and calls)
into an AST, then walking it with its C generator back to source."""

import sys

from pycparser import c_generator, c_parser


def source(functions: int) -> str:
    out = ["typedef struct point { int x; int y; } point;", "int g(int a, int b);"]
    for i in range(functions):
        out.append(f"""
int f{i}(int n, point *p) {{
    int s = 0;
    for (int i = 0; i < n; i++) {{
        if ((i % 3) == 0 && p->x > {i}) s += g(i, p->y) * 2;
        else if (i & 1) s -= (p->x + i) / (p->y | 1);
        else {{ s ^= i << 2; p->y = s ? s : 1; }}
    }}
    while (s > 1000) s = s / 2 - {i};
    return s + sizeof(point);
}}""")
    return "\n".join(out)


ast = c_parser.CParser().parse(source(260))
print(f"{len(c_generator.CGenerator().visit(ast))} characters regenerated", file=sys.stderr)
