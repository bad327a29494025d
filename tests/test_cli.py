"""The command line: ember demo, ember explain, ember cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _ember(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(os.environ))


def _ember_here(monkeypatch, capsys, *args, cwd):
    """The command line in this process (an interpreter takes seconds to start): its exit code,
    stdout and stderr. A SystemExit's message goes to stderr with code 1, as Python's exit does;
    any other exception fails the test, as a traceback in a subprocess's stderr would."""
    from ember.cli import main

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (explain puts the file's folder first)
    try:
        code = main(list(args))
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = 1 if isinstance(e.code, str) else e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code or 0, out, err)


def test_demo(tmp_path, monkeypatch, capsys):
    # in this process (an interpreter takes seconds to start; test_explain_a_function_in_a_file
    # runs `python -m ember.cli` in one of its own)
    proc = _ember_here(monkeypatch, capsys, "demo", "--batch", "64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "MLP block" in out and "padded GIoU loss" in out
    assert "kernel(s)" in out and "eager" in out and "ember" in out and "relative error" in out


def test_explain_a_function_in_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch
        def loss(x, w):
            return torch.nn.functional.softmax(x * w, -1).amax(-1).mean()
    """))
    proc = _ember("explain", "model.py:loss", "--shapes", "32x64,64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kernel(s)" in proc.stdout and 'extern "C"' in proc.stdout
    full = _ember_here(monkeypatch, capsys, "explain", "model.py:loss", "--shapes", "32x64,64", "--full", "--dynamic",
                       cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    assert "-- after cse" in full.stdout and "int64_t s" in full.stdout  # symbolic sizes as arguments


def test_explain_a_function_of_no_inputs(tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch
        def table():
            return torch.arange(12.0).reshape(3, 4).exp().sum(0)
    """))
    proc = _ember_here(monkeypatch, capsys, "explain", "model.py:table", cwd=tmp_path)  # no --shapes: no inputs
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 kernel(s)" in proc.stdout and 'extern "C"' in proc.stdout


def test_explain_reports_bad_targets(tmp_path, monkeypatch, capsys):
    proc = _ember_here(monkeypatch, capsys, "explain", "missing.py:f", "--shapes", "3", cwd=tmp_path)
    assert proc.returncode != 0 and "no such file" in proc.stderr
    # bad shapes, dtypes and input counts are usage errors, not tracebacks
    (tmp_path / "model.py").write_text("def add(x, y):\n    return x + y\n")
    for args, message in ((("--shapes", "4xa,8"), "'4xa' is no shape"), (("--shapes", "4", "--dtype", "foo"),
                          "'foo' is no torch dtype"), (("--shapes", "4"), "takes 2 input(s)")):
        proc = _ember_here(monkeypatch, capsys, "explain", "model.py:add", *args, cwd=tmp_path)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_explain_reports_bad_files_functions_and_counts(tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text("def none():\n    return 1\nnotfn = 3\n")
    (tmp_path / "model.txt").write_text("def f(x):\n    return x\n")
    for target, message in (("model.py:notfn", "not a function"), ("model.txt:f", "not a Python file"),
                            ("model.py:none", "takes at most 0 input(s)")):
        proc = _ember_here(monkeypatch, capsys, "explain", target, "--shapes", "3", cwd=tmp_path)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = _ember_here(monkeypatch, capsys, "demo", "--batch", "-1", cwd=tmp_path)
    assert proc.returncode == 2 and "not positive" in proc.stderr


def test_explain_reports_errors_of_the_users_code_in_one_line(tmp_path, monkeypatch, capsys):
    # (a keyword-only argument, a function that raises and a file that fails to import each
    # printed a traceback through ember's and torch's frames)
    (tmp_path / "model.py").write_text("def kw(x, *, y):\n    return x + y\n\n"
                                       "def boom(x):\n    raise ValueError('user error inside fn')\n")
    (tmp_path / "broken.py").write_text("import no_such_module_xyz\n")
    for target, message in (("model.py:kw", "keyword-only argument(s) y"),
                            ("model.py:boom", "raised ValueError: user error inside fn"),
                            ("broken.py:f", "failed to import: ModuleNotFoundError")):
        proc = _ember_here(monkeypatch, capsys, "explain", target, "--shapes", "3", cwd=tmp_path)
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    monkeypatch.setattr("ember.config.debug", 1)  # (EMBER_DEBUG: the traceback, for the user's debugging)
    with pytest.raises(ValueError, match="user error inside fn"):
        _ember_here(monkeypatch, capsys, "explain", "model.py:boom", "--shapes", "3", cwd=tmp_path)


def test_cache_info(tmp_path, monkeypatch, capsys):
    proc = _ember_here(monkeypatch, capsys, "cache", "info", cwd=tmp_path)
    assert proc.returncode == 0 and "built module(s)" in proc.stdout


def test_cache_info_counts_modules_not_builds_in_progress(tmp_path, monkeypatch, capsys):
    # another process's build in a hidden directory was counted, and crashed the count when it
    # vanished between listing and stat
    root = tmp_path / "cache"
    (root / "cpp" / ".build-x").mkdir(parents=True)
    (root / "cpp" / ".build-x" / "kernels.so").write_bytes(b"x" * 10)
    (root / "cpp" / "k.so").write_bytes(b"x" * 2_000_000)
    (root / "triton").mkdir()
    (root / "triton" / ".k1.py.12.34.tmp").write_text("x")
    import ember
    monkeypatch.setattr(ember.config, "cache_dir", root)  # (what EMBER_CACHE_DIR sets at import)
    proc = _ember_here(monkeypatch, capsys, "cache", "info", cwd=tmp_path)
    assert proc.returncode == 0 and "1 built module(s), 2.0 MB" in proc.stdout, proc.stdout + proc.stderr


def test_cache_info_survives_a_directory_removed_while_it_is_listed(tmp_path, monkeypatch, capsys):
    # CI: another test process's build directory vanished between being listed and being read,
    # and `ember cache info` failed with FileNotFoundError
    root = tmp_path / "cache"
    (root / "cpp" / "gone").mkdir(parents=True)
    (root / "cpp" / "k.so").write_bytes(b"x" * 1_000_000)
    real_scandir = os.scandir

    def scandir(path="."):
        if os.path.basename(os.fspath(path)) == "gone":
            raise FileNotFoundError(2, "No such file or directory", os.fspath(path))
        return real_scandir(path)

    import ember
    monkeypatch.setattr(ember.config, "cache_dir", root)
    monkeypatch.setattr(os, "scandir", scandir)
    proc = _ember_here(monkeypatch, capsys, "cache", "info", cwd=tmp_path)
    assert proc.returncode == 0 and "1 built module(s), 1.0 MB" in proc.stdout, proc.stdout + proc.stderr


def test_cache_clear_removes_only_embers_kernels(tmp_path, monkeypatch, capsys):
    # EMBER_CACHE_DIR may name a directory that holds other things: clear removed all of it
    root = tmp_path / "cache"
    (root / "cpp").mkdir(parents=True)
    (root / "cpp" / "k.so").write_bytes(b"x")
    (root / "choices.json").write_text("{}")  # (timed choices: runtime/choice.py)
    (root / "notes.txt").write_text("keep me")
    import ember
    monkeypatch.setattr(ember.config, "cache_dir", root)
    proc = _ember_here(monkeypatch, capsys, "cache", "clear", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (root / "cpp").exists() and not (root / "choices.json").exists()
    assert (root / "notes.txt").read_text() == "keep me"
    # a file where a kernel cache goes (reported cleared, and kept) is removed too
    (root / "triton").write_text("x")
    assert _ember_here(monkeypatch, capsys, "cache", "clear", cwd=tmp_path).returncode == 0
    assert not (root / "triton").exists() and (root / "notes.txt").exists()


def test_cache_clear_empties_a_cache_folder_that_is_a_link(tmp_path, monkeypatch, capsys):
    # cpp/ linked to another disk: rmtree refuses a link, and the clear failed
    import ember
    from ember import cli

    root, elsewhere, outside = tmp_path / "cache", tmp_path / "big disk", tmp_path / "outside"
    root.mkdir()
    (elsewhere / "ab").mkdir(parents=True)
    (elsewhere / "ab" / "k.so").write_bytes(b"x")
    outside.mkdir()
    (outside / "keep.txt").write_text("keep me")
    (elsewhere / "a link").symlink_to(outside)  # removed, not followed
    (root / "cpp").symlink_to(elsewhere)
    (root / "choices.json").symlink_to(tmp_path / "gone.json")  # a link to nothing
    monkeypatch.setattr(ember.config, "cache_dir", root)
    assert cli.main(["cache", "clear"]) == 0, capsys.readouterr().err
    assert (root / "cpp").is_symlink() and list(elsewhere.iterdir()) == []
    assert not (root / "choices.json").is_symlink()
    assert (outside / "keep.txt").read_text() == "keep me"


def test_explain_reports_a_class_named_as_the_function(tmp_path, monkeypatch, capsys):
    # the class was called with the inputs: a traceback from its __init__
    (tmp_path / "model.py").write_text("import torch\nclass Net(torch.nn.Module):\n"
                                       "    def forward(self, x):\n        return x.relu()\n")
    proc = _ember_here(monkeypatch, capsys, "explain", "model.py:Net", "--shapes", "4", cwd=tmp_path)
    assert proc.returncode == 1 and "is a class" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_cache_clear_reports_what_it_could_not_remove(tmp_path, monkeypatch, capsys):
    # a read-only cache was reported "cleared" with every file still there (and a cache
    # directory naming a file, cleared too)
    import ember
    from ember import cli

    root = tmp_path / "cache"
    (root / "cpp").mkdir(parents=True)
    (root / "cpp" / "k.so").write_bytes(b"x")
    monkeypatch.setattr(ember.config, "cache_dir", root)
    real_unlink = os.unlink

    def read_only(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "unlink", read_only)
    assert cli.main(["cache", "clear"]) == 1
    err = capsys.readouterr().err
    assert "could not clear" in err and "k.so: Permission denied" in err, err
    assert (root / "cpp" / "k.so").exists()
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert cli.main(["cache", "clear"]) == 0 and not (root / "cpp").exists()

    blocker = tmp_path / "a file"
    blocker.write_text("x")
    monkeypatch.setattr(ember.config, "cache_dir", blocker)
    for action in ("clear", "info"):
        assert cli.main(["cache", action]) == 1
        assert "is not a directory" in capsys.readouterr().err
    assert blocker.read_text() == "x"
