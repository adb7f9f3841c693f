"""Python-Markdown rendering a generated document (headings, nested lists, emphasis, links, code blocks,
tables and footnotes through its extensions) to HTML."""

import sys

import markdown


def document(sections: int) -> str:
    parts = []
    for s in range(sections):
        parts.append(f"## Section {s}: *the* `{s}`th part\n")
        parts.append(f"Some **bold** text, some _emphasis_, a [link](https://example.org/{s}) and a footnote[^{s}].\n")
        parts.append("\n".join(f"- item {i} with `code` and *more*\n    - nested {i}" for i in range(6)) + "\n")
        parts.append("| a | b | c |\n|---|---|---|\n" + "\n".join(f"| {i} | {i * s} | **{i + s}** |" for i in range(5)) + "\n")
        parts.append("```\n" + "\n".join(f"x = {i} * y" for i in range(4)) + "\n```\n")
        parts.append(f"> quoted {s}, with a line\n> and another\n\n[^{s}]: The note of section {s}.\n")
    return "\n".join(parts)


html = markdown.markdown(document(120), extensions=["tables", "fenced_code", "footnotes"])
print(f"{len(html)} bytes of HTML", file=sys.stderr)
