"""Loops of known shape, for the analyzer's tests: `count` runs 1000 iterations, `nested` 10 outer x 50
inner, `calls` calls `g` 300 times. Records itself when run:

    python testdata/workloads/loops.py OUT.ocl MODE      (MODE: adaptive or precise; gapless)
"""

import sys


def count(n):
    s = 0
    for i in range(n):
        s += i
    return s


def nested(a, b):
    t = 0
    for i in range(a):
        for j in range(b):
            t += j
    return t


def g():
    return 1


def calls(n):
    k = 0
    for _ in range(n):
        k += g()
    return k


def main():
    count(1000)
    nested(10, 50)
    calls(300)


if __name__ == "__main__":
    import ocular

    out, mode = sys.argv[1], sys.argv[2]
    with ocular.record(out, mode=mode, deinstrument_threshold=0):
        main()
