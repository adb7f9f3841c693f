#!/usr/bin/env python3
"""Renders an Ocular HTML report in headless Chromium and checks that its flame graph was drawn.

    python3 scripts/render_report.py out/demo.html out/demo-report.png

Three checks, all on what the browser made of the page, offline (file://, no network):
- no script of the page threw (Chromium's console, logged to stderr);
- the DOM after the page's scripts ran holds the flame graph's frames (SVG rects with a width), one of
  them named after the hottest function of the report's own `stats` table;
- the screenshot has the flame graph's warm colours over a real share of the chart's area (the PNG is
  decoded here with zlib, no imaging library needed).
Exits 1 with the reason when either fails. Standard library only.
"""

from __future__ import annotations

import html
import json
import re
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    "--virtual-time-budget=5000",
]


def chromium(page: Path, *args: str) -> str:
    """Chromium's stdout; exits if the page's scripts threw (the console's errors, logged to stderr)."""
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            ["chromium", *FLAGS, "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}", *args,
             page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
        )
    if out.returncode != 0:
        sys.exit(f"chromium failed ({out.returncode}): {out.stderr[-2000:]}")
    thrown = [line for line in out.stderr.splitlines() if ":CONSOLE" in line and "Uncaught" in line]
    thrown += [line for line in out.stderr.splitlines() if ":CONSOLE" in line and "could not be drawn" in line]
    if thrown:
        sys.exit(f"{page}: the page's scripts failed:\n" + "\n".join(thrown))
    return out.stdout


def read_png(path: Path) -> tuple[int, int, list[bytes], int]:
    """(width, height, rows of pixels, bytes per pixel): 8-bit RGB or RGBA, non-interlaced, as Chromium
    writes them."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                raise ValueError(f"{path}: unsupported PNG (depth {depth}, colour {colour})")
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows, bpp


def main() -> int:
    page, shot = Path(sys.argv[1]), Path(sys.argv[2])
    text = page.read_text()
    m = re.search(r'<script type="application/json" id="ocular-data">(.*?)</script>', text, re.S)
    if not m:
        sys.exit(f"{page}: no embedded data: not an Ocular report")
    data = json.loads(m.group(1))
    hottest = data["stats"][0]["function"]

    dom = chromium(page, "--dump-dom")
    frames = [g for g in re.findall(r"<g [^>]*>", dom) if 'class="frame' in g]
    wide = [g for g in frames if float((re.search(r' width="([0-9.e+-]+)"', g) or [0, "0"])[1]) >= 1]
    if not wide:
        sys.exit(f"{page}: the flame graph drew no frame ({len(frames)} frame groups in the DOM)")
    if not any(f'name="{html.escape(hottest, quote=False)}"' in g for g in wide):
        sys.exit(f"{page}: no frame is named after the hottest function, {hottest}")

    chromium(page, f"--screenshot={shot.resolve()}")
    width, height, rows, bpp = read_png(shot)
    warm = 0
    top, bottom = height // 5, height  # below the header and the controls
    for y in range(top, bottom):
        row = rows[y]
        for x in range(0, width * bpp, bpp):
            r, g, b = row[x], row[x + 1], row[x + 2]
            if r > 190 and 60 < g < 200 and b < 110:
                warm += 1
    share = warm / (width * (bottom - top))
    print(
        f"{page}: {len(wide)} frames drawn (hottest function {hottest} among them); "
        f"screenshot {shot} {width}x{height}, flame colours on {share:.1%} of the chart area"
    )
    if share < 0.01:
        sys.exit(f"{shot}: the flame graph's colours cover {share:.2%} of the chart area: not drawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
