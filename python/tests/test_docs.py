"""The README's PyTorch example, run as its text says: under torchrun, 2 Gloo processes."""
import os
import pathlib
import re
import subprocess
import sys

import torch

from conftest import REPO


def _block(text: str, name: str) -> str:
    m = re.search(r"<!-- snippet: " + re.escape(name) + r" -->\s*```python\n(.*?)```", text, re.S)
    assert m, f"no python block marked '{name}'"
    return m.group(1)


def test_readme_ddp_example_runs_under_torchrun(tmp_path):
    code = _block((REPO / "README.md").read_text(), "python-ddp")
    assert len(code.strip().splitlines()) <= 16
    script = tmp_path / "train.py"
    script.write_text(code)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    # The two ranks share one pipe: find each report wherever its line landed.
    sent = {int(r): int(b) for r, b in re.findall(r"rank (\d+): (\d+) bytes sent", run.stdout)}
    assert sorted(sent) == [0, 1], run.stdout + run.stderr[-2000:]
    for rank in (0, 1):
        assert 0 < sent[rank] < 4 * 101770 / 10, sent  # top-1 %: about 2 % of fp32's bytes (index + value)
        state = torch.load(tmp_path / f"hook{rank}.pt")
        assert state["iter"] == 20 and len(state["residuals"]) == 4
