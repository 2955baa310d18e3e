"""The README's Python block, run as written."""

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_python_block_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, f"{README}: expected one python block, found {len(blocks)}"
    out = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    evicted, resident = re.fullmatch(r"(\d+) pages evicted, (\d+) MiB resident\n", out.stdout).groups()
    assert int(evicted) >= 3 * (256 << 20) // 4096 and int(resident) <= 256 * 1.1, out.stdout
