"""Bad input at the CLI: one line on stderr, exit code 2, no half-made run dir, and no torch import
(so the error comes at once instead of after 5-8 s of loading torch and transformers)."""

import os
import subprocess
import sys

import pytest

CHECK = """
import sys
from esopt.cli import main
rc = main(sys.argv[1:])
print(f"rc={rc} torch_loaded={'torch' in sys.modules}")
"""


@pytest.mark.parametrize("override, message", [
    ("env.kwargs.sizee=4", "env esopt/Sudoku-v0: unknown argument 'sizee'"),
    ("env.id=esopt/Nope-v0", "unknown env id 'esopt/Nope-v0'"),
    ("model.device=gpu", "model.device: must be cpu, auto, cuda, cuda:N, mps or xpu"),
    ("es.noise=sparse", "unknown noise kind 'sparse'"),
    ("es.sigma=-1", "es.sigma: Input should be greater than 0"),
])
def test_bad_train_input_is_one_line_exit_2_and_leaves_no_run_dir(tmp_path, override, message):
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-c", CHECK, "train", "smoke", "--out", str(out), override],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert "rc=2 torch_loaded=False" in res.stdout, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert not out.exists()


def test_a_failed_model_load_removes_the_run_dir_it_created(tmp_path):
    from esopt.train.config import load_config
    from esopt.train.es import train

    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="unknown model"):
        train(load_config("smoke", ["model.name=/no/such/model"]), out, progress=False)
    assert not out.exists()


def test_eval_takes_any_env_through_env_kwargs(capsys):
    from esopt.cli import main

    assert main(["eval", "--model", "tiny", "--env-kwargs", '{"size": 4, "h_star": 2}', "--episodes", "2",
                 "--max-new-tokens", "4", "--samples", "0", "--no-progress"]) == 0
    assert "{'size': 4, 'h_star': 2}" in capsys.readouterr().out
    assert main(["eval", "--model", "tiny", "--env-kwargs", "{size: 4}"]) == 2
    assert "--env-kwargs is not valid JSON" in capsys.readouterr().err
