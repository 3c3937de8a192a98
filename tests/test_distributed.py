"""linearkit.distributed: one-process behaviour here, the multi-rank checks under ``mpirun -n 2``.

The multi-rank tests start ``mpirun`` in a subprocess (the scripts are in
tests/distributed_scripts/); they skip, with the reason, only when a probe job cannot start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import linearkit as lk
from linearkit import distributed as D

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "distributed_scripts"


# ---------------------------------------------------------------------- one process
def test_one_process_is_a_world_of_one_without_mpi4py():
    code = ("import sys, linearkit.distributed as D; "
            "print(D.rank(), D.world_size(), D.is_initialized(), 'mpi4py' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in D.comm.LAUNCHER_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=env)
    assert out.stdout.split() == ["0", "1", "False", "False"]


def test_missing_mpi4py_names_the_extra():
    code = ("import sys; sys.modules['mpi4py'] = None; import linearkit.distributed as D\n"
            "try:\n    D.world_size()\nexcept ImportError as e:\n    print(e)")
    env = {**os.environ, "OMPI_COMM_WORLD_SIZE": "2"}  # as if started by mpirun
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=env)
    assert 'pip install "linearkit[mpi]"' in out.stdout


@pytest.mark.parametrize("text, expected", [(None, D.DEFAULT_TIMEOUT), ("", D.DEFAULT_TIMEOUT),
                                            ("2.5", 2.5), ("60", 60.0)])
def test_timeout_from_the_environment(monkeypatch, text, expected):
    if text is None:
        monkeypatch.delenv("LINEARKIT_MPI_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("LINEARKIT_MPI_TIMEOUT", text)
    assert D.timeout() == expected


@pytest.mark.parametrize("text", ["0", "-1", "abc", "inf", "nan"])
def test_bad_timeout_says_what_is_expected(monkeypatch, text):
    monkeypatch.setenv("LINEARKIT_MPI_TIMEOUT", text)
    with pytest.raises(ValueError, match="LINEARKIT_MPI_TIMEOUT must be a number of seconds"):
        D.timeout()


def test_collectives_of_one_rank_return_at_once():
    a = np.arange(6.0).reshape(2, 3)
    assert D.allreduce_(a) is a and D.allgather_rows(a) is a and D.broadcast_(a) is a
    D.barrier()
    model = lk.Linear(3, 2, rng=np.random.default_rng(0))
    pred, back = model.vjp(np.ones((4, 3), np.float32), input_grad=False)
    back(np.ones_like(pred))
    before = model.weight.grad.copy()
    reducer = D.GradientReducer(model)
    assert reducer.synchronize(1.5) == 1.5
    np.testing.assert_array_equal(model.weight.grad, before)
    assert reducer.bytes_per_step == 4 * (6 + 2)
    D.broadcast_parameters(model)
    D.allreduce_gradients(model)


def test_reducer_arguments_are_checked():
    with pytest.raises(ValueError, match="bucket_bytes must be an int >= 1"):
        D.GradientReducer(lk.Linear(2, 2), bucket_bytes=0)
    with pytest.raises(ValueError, match="pass the model"):
        D.GradientReducer(list(lk.Linear(2, 2).parameters()), overlap=True)


def test_data_parallel_train_of_one_rank_is_the_plain_run():
    from linearkit.recipes.train_mnist1d import train

    m1, r1 = train(steps=15, eval_every=0)
    m2, r2 = train(steps=15, eval_every=0, distributed=True)
    assert r1.final_loss == r2.final_loss and r2.ranks == 1
    for p, q in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


# ---------------------------------------------------------------------- the sampler
def _torch_indices(n, replicas, rank, shuffle, seed, drop_last, epoch=0):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler as TorchSampler

    s = TorchSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                     drop_last=drop_last)
    s.set_epoch(epoch)
    del torch
    return list(s), len(s)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [1, 2, 5, 10, 11, 17])
def test_sampler_matches_torch_without_shuffle(n, replicas, drop_last):
    for rank in range(replicas):
        ours = D.DistributedSampler(n, replicas, rank, shuffle=False, drop_last=drop_last)
        want, length = _torch_indices(n, replicas, rank, False, 0, drop_last)
        assert list(ours) == want and len(ours) == length


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, replicas", [(10, 3), (5, 8), (16, 4), (1, 3)])
def test_padding_and_striding_match_torch_on_torchs_permutation(n, replicas, drop_last):
    torch = pytest.importorskip("torch")
    for epoch in (0, 3):
        g = torch.Generator()
        g.manual_seed(7 + epoch)
        order = torch.randperm(n, generator=g).tolist()
        for rank in range(replicas):
            want, _ = _torch_indices(n, replicas, rank, True, 7, drop_last, epoch)
            assert D.shard_indices(order, replicas, rank, drop_last) == want


def test_sampler_shuffles_the_same_on_every_rank_and_by_epoch():
    ranks = [D.DistributedSampler(10, 3, r, seed=5) for r in range(3)]
    every = [i for s in ranks for i in s]
    assert set(every) == set(range(10)) and len(every) == 12  # 4 each: 2 indices repeated
    order = ranks[0].order()
    assert not np.array_equal(order, np.arange(10))  # shuffled
    assert all(np.array_equal(s.order(), order) for s in ranks)
    for s in ranks:
        s.set_epoch(1)
    assert not np.array_equal(ranks[0].order(), order)


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 4, "num_replicas": 2, "rank": 2}, r"rank must be in \[0, 1\]"),
    ({"n": -1, "num_replicas": 2, "rank": 0}, "n must be an int >= 0"),
    ({"n": 4, "num_replicas": 0, "rank": 0}, "num_replicas must be an int >= 1")])
def test_sampler_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        D.DistributedSampler(**kwargs)


def test_n_ranks_of_batch_b_are_one_process_of_batch_n_times_b():
    """Sampler batches of b on each of N ranks == rows r::N of the single process's N·b batch,
    which is what shard_batch takes, so their union is that batch."""
    n, replicas, b = 24, 3, 2
    x = np.arange(n * 2.0).reshape(n, 2)
    per_rank = [list(D.DistributedSampler(n, replicas, r, shuffle=False)) for r in range(replicas)]
    for k in range(n // (replicas * b)):
        global_batch = x[k * replicas * b:(k + 1) * replicas * b]
        for r in range(replicas):
            rows = per_rank[r][k * b:(k + 1) * b]
            np.testing.assert_array_equal(D.shard_batch(global_batch, rank=r,
                                                        num_replicas=replicas), x[rows])


def test_shard_batch_needs_equal_shards():
    with pytest.raises(ValueError, match="multiple of 3"):
        D.shard_batch(np.zeros((10, 2)), rank=0, num_replicas=3)
    with pytest.raises(ValueError, match="different row counts"):
        D.shard_batch(np.zeros((4, 2)), np.zeros(3), rank=0, num_replicas=2)


# ---------------------------------------------------------------------- tensor parallel, one process
@pytest.mark.parametrize("n, parts", [(7, 2), (9, 4), (4, 4), (10, 3)])
def test_split_range_is_array_split(n, parts):
    pieces = np.array_split(np.arange(n), parts)
    assert [D.split_range(n, parts, r) for r in range(parts)] == \
        [(int(p[0]), int(p[-1]) + 1) for p in pieces]


@pytest.mark.parametrize("mode", ["column", "row"])
def test_a_shard_of_one_rank_is_the_layer(mode):
    full = lk.Linear(5, 4, dtype=np.float64, rng=np.random.default_rng(0))
    shard = D.shard_linear(full, mode=mode)
    x, dy = np.random.default_rng(1).standard_normal((2, 3, 5)), np.ones((2, 3, 4))
    y, back = shard.vjp(x)
    y_ref, back_ref = full.vjp(x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(back(dy), back_ref(dy), rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(shard.weight.grad, full.weight.grad, rtol=1e-14, atol=1e-14)
    again = D.gather_linear(shard)
    np.testing.assert_array_equal(again.weight.data, full.weight.data)


def test_shard_for_two_ranks_refuses_to_run_in_one_process():
    shard = D.shard_linear(lk.Linear(4, 6), rank=1, world_size=2, mode="column")
    assert shard.weight.shape == (3, 4) and (shard.lo, shard.hi) == (3, 6)
    with pytest.raises(RuntimeError, match="holds a shard for 2 ranks but runs in a group of 1"):
        shard(np.ones((1, 4), np.float32))


def test_parallel_layer_errors():
    with pytest.raises(ValueError, match="mode must be 'column'"):
        D.shard_linear(lk.Linear(2, 2), mode="diagonal")
    with pytest.raises(ValueError, match="cannot be split over 3 ranks"):
        D.ColumnParallelLinear(4, 2, rank=0, world_size=3)
    with pytest.raises(TypeError, match="float32 or float64"):
        D.RowParallelLinear(4, 2, dtype=np.float16)
    row = D.RowParallelLinear(4, 2, input_is_parallel=True)
    with pytest.raises(lk.ShapeError, match=r"\(\*, 4\)"):
        row(np.ones((3, 5), np.float32))
    with pytest.raises(ValueError, match="fc1 gives 3 features but fc2 takes 4"):
        D.parallel_mlp(lk.Linear(2, 3), lk.ReLU(), lk.Linear(4, 1))


def test_the_ledger_counts_a_ranks_shard_and_its_communication():
    fc1, fc2 = lk.Linear(784, 256), lk.Linear(256, 10)
    model = lk.Sequential(D.shard_linear(fc1, 1, 2, "column", gather_output=False), lk.ReLU(),
                          D.shard_linear(fc2, 1, 2, "row", input_is_parallel=True))
    report = lk.analysis.ledger(model, (64, 784))
    assert report["0"].params == 128 * 784 + 128 and report["2"].params == 10 * 128 + 10
    assert report["0"].output_shape == (64, 128)
    assert "backward (when dx is needed) all-reduce 196.0 KiB" in report["0"].note
    assert "forward all-reduce 2.5 KiB" in report["2"].note
    assert report["0"].kind == "column_parallel_linear"


# ---------------------------------------------------------------------- the command line
def test_train_global_batch_must_split_over_the_ranks(tmp_path, capsys):
    from linearkit.cli.commands import main

    pytest.importorskip("safetensors")
    code = main(["train", "--ranks", "3", "--batch-size", "100", "--out",
                 str(tmp_path / "w.safetensors")])
    assert code == 2
    err = capsys.readouterr().err
    assert "must be a multiple of 3" in err and "--batch-size 99" in err


# ---------------------------------------------------------------------- under mpirun -n 2
@pytest.fixture(scope="session")
def mpirun():
    """``run(args, env=..., timeout=...)`` for ``mpirun -n 2 ...``, after one probe job."""
    if not D.is_available():
        pytest.skip('mpi4py is not installed (pip install "linearkit[mpi]")')
    from linearkit.distributed.launch import find_mpirun, mpirun_command, rank_environment

    try:
        find_mpirun()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    env = rank_environment(2)

    def run(args, timeout=60, extra_env=None):
        return subprocess.run(mpirun_command(2, [sys.executable, *map(str, args)]),
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**env, **(extra_env or {})}, check=False)

    probe = run(["-c", "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"])
    if probe.returncode != 0:
        pytest.skip(f"mpirun -n 2 cannot start here: {probe.stderr.strip()[-400:]}")
    return run


CHECK_NAMES = ["dp_adam_clip_accumulation", "dp_averaged_gradient_is_the_full_batch_gradient",
               "dp_overlap_one_bucket_per_layer",
               "dp_buckets_do_not_change_bits", "dp_frozen_and_missing_gradients",
               "dp_one_buffer_per_dtype", "dp_scaler_skips_on_every_rank",
               "broadcast_parameters_and_buffers", "tp_column_and_row_alone_uneven",
               "tp_parallel_mlp_one_allreduce_each_way"]


@pytest.fixture(scope="module")
def checks(mpirun, tmp_path_factory):
    out = tmp_path_factory.mktemp("mpi") / "checks.json"
    done = mpirun([SCRIPTS / "checks.py", out], extra_env={"LINEARKIT_MPI_TIMEOUT": "30"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_two_ranks(checks, name):
    """Each check of tests/distributed_scripts/checks.py, on both ranks (float64, 1e-12)."""
    assert name in checks, f"{name} did not run; ran {sorted(checks)}"
    for rank, result in checks[name].items():
        assert result["ok"], f"rank {rank}:\n{result['detail']}"


def test_two_ranks_ran_every_check(checks):
    assert sorted(checks) == sorted(CHECK_NAMES)


def test_a_rank_that_raises_aborts_the_job_with_its_message(mpirun):
    started = time.monotonic()
    done = mpirun([SCRIPTS / "fail.py", "raise"], timeout=60)
    assert done.returncode != 0
    assert "rank 1: ValueError: rank 1 broke on purpose" in done.stderr
    assert "unreachable" not in done.stdout
    assert time.monotonic() - started < 30


def test_a_stuck_rank_times_out_the_others_collective(mpirun):
    started = time.monotonic()
    done = mpirun([SCRIPTS / "fail.py", "hang"], timeout=60,
                  extra_env={"LINEARKIT_MPI_TIMEOUT": "2"})
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    assert re.search(r"rank 0: .* did not complete within 2 s \(LINEARKIT_MPI_TIMEOUT\)",
                     done.stderr), done.stderr[-2000:]
    assert elapsed < 20  # the stuck rank sleeps 120 s: the abort ended it


def _cli(*args):
    return [sys.executable, "-m", "linearkit.cli", *map(str, args)]


def test_train_on_two_ranks_matches_one_process(mpirun, tmp_path):
    pytest.importorskip("safetensors")
    env = {k: v for k, v in os.environ.items() if k not in D.comm.LAUNCHER_VARIABLES}
    runs = {}
    for ranks in (1, 2):
        out = tmp_path / f"r{ranks}.safetensors"
        done = subprocess.run(_cli("train", "--ranks", ranks, "--steps", 300, "--json", "--out",
                                   out), capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env=env, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stdout.strip().splitlines()
        assert len(lines) == 1, done.stdout   # rank 1 is quiet
        runs[ranks] = json.loads(lines[0])
        assert out.exists()
    assert runs[2]["ranks"] == 2 and runs[1]["ranks"] == 1
    # float32 rounding differs (each rank's GEMMs see 50 rows), so the runs part after ~100
    # steps; the accuracy stays in the same band.
    assert abs(runs[2]["test_accuracy"] - runs[1]["test_accuracy"]) < 0.05, runs
    assert abs(runs[2]["final_loss"] - runs[1]["final_loss"]) < 0.1, runs


def _descendants(root: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == pid]
        found += kids
        frontier += kids
    return found


def _rank_pid(root: int, rank: int) -> int | None:
    for pid in _descendants(root):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}\0".encode() in environ or \
                f"PMIX_RANK={rank}\0".encode() in environ:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"linearkit.cli" in cmdline:
                return pid
    return None


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank's process in /proc")
def test_train_killed_rank_ends_the_job_with_a_clear_message(mpirun, tmp_path):
    pytest.importorskip("safetensors")
    out = tmp_path / "w.safetensors"
    env = {k: v for k, v in os.environ.items() if k not in D.comm.LAUNCHER_VARIABLES}
    env["LINEARKIT_MPI_TIMEOUT"] = "30"
    proc = subprocess.Popen(_cli("train", "--ranks", 2, "--steps", 10**6, "--eval-every", 20,
                                 "--out", out), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, env=env)
    streams = {"out": bytearray(), "err": bytearray()}

    def read(stream, into):
        for chunk in iter(lambda: stream.read1(4096), b""):
            into.extend(chunk)

    readers = [threading.Thread(target=read, args=(proc.stdout, streams["out"])),
               threading.Thread(target=read, args=(proc.stderr, streams["err"]))]
    for reader in readers:
        reader.start()
    tree = []
    try:
        deadline = time.monotonic() + 60
        while b"step     20" not in streams["out"]:   # rank 0's first eval line: training runs
            assert proc.poll() is None, streams["err"].decode(errors="replace")
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        tree = _descendants(proc.pid)
        victim = _rank_pid(proc.pid, 1)
        assert victim is not None, "rank 1's process not found"
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(timeout=60)
        elapsed = time.monotonic() - killed
    finally:  # never leave a rank behind when the test fails: only this job's processes
        if proc.poll() is None:
            tree = _descendants(proc.pid) + [proc.pid]
        for pid in tree:
            with contextlib.suppress(OSError):
                if str(out).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        for reader in readers:
            reader.join(timeout=10)
    text = streams["err"].decode(errors="replace")
    assert code == 1, text[-2000:]
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end after the kill"
    assert re.search(r"rank 1 .*exited on\s+signal 9", text), text[-2000:]
    assert "the 2-rank job failed" in text
    assert not out.exists()


@pytest.mark.parametrize("cls", ["ColumnParallelLinear", "RowParallelLinear"])
@pytest.mark.parametrize("ranks", [1, 3])
def test_shards_of_a_large_layer_are_the_full_linears_init_drawn_in_blocks(cls, ranks):
    """Drawn a block of rows at a time (never the whole float64 matrix), every rank's shard is
    still its slice of one seeded Linear, and each rank's generator ends where the Linear's did."""
    full_rng = np.random.default_rng(7)
    full = lk.Linear(300, 1001, rng=full_rng)
    layer = getattr(D, cls)
    weights, biases = [], []
    for rank in range(ranks):
        rng = np.random.default_rng(7)
        shard = layer(300, 1001, rank=rank, world_size=ranks, rng=rng)
        weights.append(shard.weight.data)
        biases.append(shard.bias.data)
        assert rng.bit_generator.state == full_rng.bit_generator.state
    axis = 0 if cls == "ColumnParallelLinear" else 1
    np.testing.assert_array_equal(np.concatenate(weights, axis=axis), full.weight.data)
    if cls == "ColumnParallelLinear":
        np.testing.assert_array_equal(np.concatenate(biases), full.bias.data)
    else:
        np.testing.assert_array_equal(biases[0], full.bias.data)
