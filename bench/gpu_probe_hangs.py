"""Probe fuzz programs that hung or failed to build on the GPU: one program per process, with
EMBER_DEBUG timings and a Python stack dump if it is still running after PROBE_DUMP seconds.

    python bench/gpu_probe_hangs.py SEED:BACKEND[:train] ...

PROBE_DEVICE=cpu runs the program on the CPU instead (ember's C++ kernels), PROBE_TIMEOUT
(default 150) limits each program's process.
"""
import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")


def child(seed: int, backend: str, train: bool) -> None:
    import fuzz
    import torch

    import ember
    faulthandler.dump_traceback_later(float(os.environ.get("PROBE_DUMP", "60")))  # (repeat=True crashed there)
    prog = fuzz.Generator(seed, "cuda", backend, ["fp32", "bf16", "fp16"], train, False).build()
    print(prog.source, flush=True)
    fn = fuzz._exec_fn(prog.source)
    compiled = ember.compile(fuzz._exec_fn(prog.source), options={"gpu_backend": backend})
    up = seed + 1 if train else None
    for rep in range(3):
        t = time.perf_counter()
        got = fuzz.run_program(compiled, fuzz.make_inputs(prog.specs, DEVICE, train, None), up)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        print(f"call {rep}: {time.perf_counter() - t:.2f} s", flush=True)
    eager = fuzz.run_program(fn, fuzz.make_inputs(prog.specs, DEVICE, train, None), up)
    for part in ("outs", "grads"):
        for i, (e, g) in enumerate(zip(got[part] or [], eager[part] or [])):
            if e is not None and g is not None and e.shape == g.shape and e.numel():
                d = (e.double() - g.double()).abs().nan_to_num(float("inf")).max().item()
                print(f"{part} {i} max|ember-eager| {d:.3g}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        s, b, t = sys.argv[2:5]
        child(int(s), b, t == "1")
        sys.exit(0)
    for item in sys.argv[1:]:
        seed, backend, *rest = item.split(":")
        env = dict(os.environ, EMBER_DEBUG=os.environ.get("EMBER_DEBUG", "1"))
        print(f"===== {item}", flush=True)
        t = time.perf_counter()
        # (output to a file, the child in a session of its own: a compile worker it started
        # would otherwise hold a pipe open past the timeout, and the probe with it)
        with tempfile.TemporaryFile("w+") as log:
            child_process = subprocess.Popen([sys.executable, __file__, "--child", seed, backend, "1" if rest else "0"],
                                             env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                child_process.wait(timeout=float(os.environ.get("PROBE_TIMEOUT", "150")))
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(child_process.pid, signal.SIGKILL)
                child_process.wait()
                timed_out = True
            log.seek(0)
            lines = [ln for ln in log.read().splitlines() if "Warning" not in ln]
        print("\n".join(lines[-150:] + (["TIMEOUT"] if timed_out else [])))
        print(f"----- {item}: {time.perf_counter() - t:.1f} s", flush=True)
