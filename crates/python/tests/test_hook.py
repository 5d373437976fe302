"""The DDP communication hook against Gloo, a killed rank, and the package without torch.

Each test starts its ranks as processes of this file (``python test_hook.py ROLE ...``)
with the environment torchrun gives (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on
127.0.0.1, on ports found free by binding port 0.
"""

import os
import signal
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 4


def free_port():
    """A port free on loopback, with the next two free too (Syncopate's rendezvous takes
    MASTER_PORT + 1, a second state MASTER_PORT + 2)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65534:
            continue
        try:
            for offset in (1, 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            continue
    raise RuntimeError("no three consecutive free ports")


def start_ranks(world_size, role, *args):
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        env.pop("SYNCOPATE_TOKEN", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, "test_hook.py"), role, *map(str, args)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def finish(procs, timeout=300):
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        outputs.append((p.returncode, out, err))
    return outputs


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_hook_trains_as_gloo_does(world_size, tmp_path):
    outputs = finish(start_ranks(world_size, "compare", tmp_path))
    for rank, (code, _, err) in enumerate(outputs):
        assert code == 0, f"rank {rank} failed:\n{err}"
    import numpy as np

    runs = {
        (backend, rank): np.load(tmp_path / f"{backend}-{rank}.npy")
        for backend in ("gloo", "syncopate")
        for rank in range(world_size)
    }
    reference = runs[("gloo", 0)]
    initial = np.load(tmp_path / "initial-0.npy")
    assert not np.allclose(reference, initial), "training moved no weight"
    for rank in range(world_size):
        mine = runs[("syncopate", rank)]
        np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-6)
        # The ring gives every rank the same bits.
        assert mine.tobytes() == runs[("syncopate", 0)].tobytes(), f"rank {rank}"


def test_a_killed_rank_ends_the_job_naming_it():
    procs = start_ranks(3, "train-forever")
    victim = procs[1]
    # Every rank is training once each has printed its third step.
    for p in procs:
        for line in p.stdout:
            if line.startswith("step 3"):
                break
        else:
            pytest.fail(f"a rank ended before step 3: {p.communicate()[1]}")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for rank in (0, 2):
        # Bounded only so that a hang fails the test instead of stalling it.
        _, err = procs[rank].communicate(timeout=120)
        assert procs[rank].returncode not in (0, None), f"rank {rank} went on:\n{err}"
        assert "rank 1" in err, f"rank {rank}'s error does not name rank 1:\n{err}"


def test_local_sgd_averages_every_h_steps(tmp_path):
    outputs = finish(start_ranks(2, "local-sgd", tmp_path))
    for rank, (code, _, err) in enumerate(outputs):
        assert code == 0, f"rank {rank} failed:\n{err}"
    import numpy as np

    def load(rank, step):
        return np.load(tmp_path / f"local-{rank}-{step}.npy")

    # Steps 1 and 3 are local: each rank its own data, its own weights.
    for step in (1, 3):
        assert not np.array_equal(load(0, step), load(1, step)), f"step {step}"
    # After step 2 and 4 the ranks hold the same bits: the average of their local steps.
    for step in (2, 4):
        assert load(0, step).tobytes() == load(1, step).tobytes(), f"step {step}"
    before = [np.load(tmp_path / f"local-{rank}-4-before.npy") for rank in (0, 1)]
    np.testing.assert_allclose(load(0, 4), (before[0] + before[1]) / 2, rtol=1e-6, atol=1e-7)


def _ok(outputs):
    for rank, (code, _, err) in enumerate(outputs):
        assert code == 0, f"rank {rank} failed:\n{err}"


def test_a_failed_collective_raises_a_runtime_error_naming_the_rank():
    outputs = finish(start_ranks(2, "lost-peer"), timeout=120)
    code, out, err = outputs[0]
    assert code == 0, err
    assert "RuntimeError" in out and "rank 1" in out, out


def test_frame_macs_off_reduce_alike_and_a_mismatch_is_refused(monkeypatch):
    outputs = finish(start_ranks(2, "frame-mac"), timeout=120)
    for rank, (code, out, err) in enumerate(outputs):
        assert code == 0, f"rank {rank} failed:\n{err}"
        assert "joined" not in out, f"rank {rank} joined a ring whose frame MACs differ"
    messages = "".join(out for _, out, _ in outputs)
    assert "frame MACs" in messages, messages
    import syncopate.torch

    monkeypatch.setenv("SYNCOPATE_FRAME_MAC", "perhaps")
    with pytest.raises(ValueError, match="SYNCOPATE_FRAME_MAC"):
        syncopate.torch.SyncopateState(token="00" * 32)


def test_half_precision_is_reduced_and_other_dtypes_refused():
    _ok(finish(start_ranks(2, "dtypes"), timeout=120))


def _has_cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _has_cuda(), reason="no CUDA device")
def test_gpu_buckets_are_staged_in_order_and_ddp_on_the_gpu_trains_as_gloo_does():
    _ok(finish(start_ranks(2, "cuda"), timeout=180))


def test_a_pause_longer_than_the_peer_timeout_is_survived():
    _ok(finish(start_ranks(2, "pause"), timeout=120))


def test_a_rank_that_never_enters_is_named_within_the_collective_timeout():
    procs = start_ranks(2, "absent")
    code, out, err = finish(procs[:1], timeout=120)[0]
    procs[1].kill()
    procs[1].communicate()
    assert code == 0, err
    assert "RuntimeError" in out and "rank 1" in out and "did not enter" in out, out


def test_a_stopped_rank_inside_a_collective_is_named():
    procs = start_ranks(2, "stopped")
    victim = procs[1]
    for line in victim.stdout:
        if line.startswith("ready"):
            break
    victim.send_signal(signal.SIGSTOP)
    try:
        code, out, err = finish(procs[:1], timeout=120)[0]
    finally:
        victim.kill()
        victim.communicate()
    assert code == 0, err
    assert "RuntimeError" in out and "rank 1" in out, out


def test_a_panic_on_the_native_thread_fails_every_pending_future():
    _ok(finish(start_ranks(2, "panic"), timeout=120))


def test_require_env_token_refuses_the_process_group_channel(monkeypatch):
    import syncopate.torch

    monkeypatch.delenv("SYNCOPATE_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match="SYNCOPATE_TOKEN"):
        syncopate.torch.SyncopateState(require_env_token=True)
    monkeypatch.setenv("SYNCOPATE_REQUIRE_TOKEN", "1")
    with pytest.raises(RuntimeError, match="unauthenticated"):
        syncopate.torch.SyncopateState()


def test_diloco_is_core_nesterov_on_the_mean_outer_gradient_and_resumes_exactly(tmp_path):
    import numpy as np

    _ok(finish(start_ranks(2, "diloco", tmp_path)))
    lr, m = 0.7, 0.9
    anchor = np.load(tmp_path / "diloco-initial-0.npy")
    velocity = np.zeros_like(anchor)
    for k in (1, 2):
        pre = [np.load(tmp_path / f"diloco-pre-{k}-{r}.npy") for r in (0, 1)]
        assert not np.array_equal(pre[0], pre[1]), "the ranks trained alike"
        d = ((anchor - pre[0]) + (anchor - pre[1])) / np.float32(2)
        velocity = np.float32(m) * velocity + d
        anchor = anchor - np.float32(lr) * (d + np.float32(m) * velocity)
        for r in (0, 1):
            post = np.load(tmp_path / f"diloco-post-{k}-{r}.npy")
            np.testing.assert_allclose(post, anchor, rtol=1e-5, atol=1e-6)
        post0 = np.load(tmp_path / f"diloco-post-{k}-0.npy")
        assert post0.tobytes() == np.load(tmp_path / f"diloco-post-{k}-1.npy").tobytes()
    for r in (0, 1):
        straight = np.load(tmp_path / f"diloco-final-{r}.npy")
        resumed = np.load(tmp_path / f"diloco-resumed-{r}.npy")
        assert straight.tobytes() == resumed.tobytes(), f"rank {r} did not resume exactly"


def test_the_package_imports_without_torch():
    import syncopate

    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(syncopate.__file__)))
    # -S: no site packages, hence no torch (nor numpy); only the package's own folder.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import syncopate; "
        "assert 'torch' not in sys.modules; print(len(syncopate.new_token()))\n"
        "try:\n    import torch\nexcept ImportError:\n    print('no torch')"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code, package_dir],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert out == ["64", "no torch"], out


# ---- the ranks' side ----


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(20, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def _batch(rank, step):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 20, generator=g), torch.randint(0, 10, (8,), generator=g)


def _train(model, steps, rank, on_step=None):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = 0
    while steps is None or step < steps:
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        step += 1
        if on_step:
            on_step(step)


def _flat(model):
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def _ddp(model, state=None):
    import syncopate.torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Buckets of about 4 KB: several per step, rebuilt after the first iteration.
    ddp = DDP(model, bucket_cap_mb=0.004)
    if state is not None:
        ddp.register_comm_hook(state, syncopate.torch.allreduce_hook)
    return ddp


def _rank_main(role, args):
    import numpy as np
    import torch
    import torch.distributed as dist

    import syncopate.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if role == "compare":
        out = args[0]
        np.save(os.path.join(out, f"initial-{rank}.npy"), _flat(_model()))
        for backend in ("gloo", "syncopate"):
            state = syncopate.torch.SyncopateState() if backend == "syncopate" else None
            model = _model()
            _train(_ddp(model, state), STEPS, rank)
            np.save(os.path.join(out, f"{backend}-{rank}.npy"), _flat(model))
            if state is not None:
                state.close()
    elif role == "local-sgd":
        out = args[0]
        state = syncopate.torch.SyncopateState()
        model = _model()
        averager = syncopate.torch.LocalSgdAverager(state, every=2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1, 5):
            x, y = _batch(rank, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            np.save(os.path.join(out, f"local-{rank}-{step}-before.npy"), _flat(model))
            averaged = averager.average_parameters(model.parameters())
            assert averaged == (step % 2 == 0), step
            np.save(os.path.join(out, f"local-{rank}-{step}.npy"), _flat(model))
        state.close()
    elif role == "frame-mac":
        # Off on every rank: the same average, untagged frames.
        state = syncopate.torch.SyncopateState(frame_mac=False)
        t = torch.full((100_000,), float(rank + 1))
        state.allreduce(t).wait()
        assert torch.equal(t, torch.full((100_000,), 1.5)), t[:4]
        state.close()
        # On here, off there: refused at the handshake, naming frame MACs.
        try:
            syncopate.torch.SyncopateState(port_offset=2, frame_mac=rank == 0, connect_timeout=20.0)
            print("joined", flush=True)
        except RuntimeError as e:
            print(f"RuntimeError: {e}", flush=True)
        os._exit(0)
    elif role == "lost-peer":
        state = syncopate.torch.SyncopateState(peer_timeout=5.0)
        dist.barrier()
        if rank == 1:
            os._exit(0)
        try:
            state.allreduce(torch.ones(1000)).wait()
            print("completed")
        except RuntimeError as e:
            print(f"RuntimeError: {e}", flush=True)
        os._exit(0)
    elif role == "dtypes":
        state = syncopate.torch.SyncopateState()
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            t = torch.arange(3000, dtype=torch.float32).remainder(64).to(dtype) * (rank + 1)
            before = t.clone()
            assert state.allreduce(t).wait().data_ptr() == t.data_ptr()
            assert t.dtype == dtype
            assert torch.equal(t, (before.float() * 1.5 / (rank + 1)).to(dtype)), dtype
        # A strided (non-contiguous) tensor is staged and written back.
        base = torch.zeros(20)
        view = base[::2]
        view.fill_(rank + 1.0)
        state.allreduce(view).wait()
        assert torch.equal(base[::2], torch.full((10,), 1.5)) and torch.equal(base[1::2], torch.zeros(10))
        for dtype in (torch.float64, torch.int64, torch.int32, torch.complex64):
            try:
                state.allreduce(torch.ones(4, dtype=dtype))
            except TypeError as e:
                assert str(dtype) in str(e), e
            else:
                raise AssertionError(f"{dtype} was not refused")
        state.close()
    elif role == "pause":
        # Heartbeats every 0.2 s from the ring's own thread keep the links alive while the
        # process sleeps five peer timeouts.
        state = syncopate.torch.SyncopateState(peer_timeout=1.0)
        assert state.allreduce(torch.full((10,), float(rank))).wait()[0] == 0.5
        if rank == 1:
            import time

            time.sleep(5.0)
        assert state.allreduce(torch.full((10,), float(rank))).wait()[0] == 0.5
        state.close()
    elif role == "absent":
        import time

        state = syncopate.torch.SyncopateState(collective_timeout=3.0)
        dist.barrier()
        if rank == 1:
            time.sleep(300)
        start = time.monotonic()
        try:
            state.allreduce(torch.ones(100)).wait()
            print("completed")
        except RuntimeError as e:
            print(f"RuntimeError: {e}", flush=True)
        assert time.monotonic() - start < 30, "the collective timeout did not bound it"
        os._exit(0)
    elif role == "stopped":
        import time

        state = syncopate.torch.SyncopateState(peer_timeout=2.0)
        state.allreduce(torch.ones(100)).wait()
        dist.barrier()
        if rank == 1:
            print("ready", flush=True)
            time.sleep(300)
        start = time.monotonic()
        try:
            state.allreduce(torch.ones(100)).wait()
            print("completed")
        except RuntimeError as e:
            print(f"RuntimeError: {e}", flush=True)
        assert time.monotonic() - start < 30, "the stopped rank was not detected"
        os._exit(0)
    elif role == "panic":
        state = syncopate.torch.SyncopateState()
        if rank == 0:
            pending = state.allreduce(torch.ones(100))  # rank 1 never joins it
            state._ring._inject_panic("injected for the test")
            queued = state.allreduce(torch.ones(100))
            for future in (pending, queued):
                try:
                    future.wait()
                except RuntimeError as e:
                    assert "injected for the test" in str(e), e
                else:
                    raise AssertionError("a future completed after the panic")
            try:
                state.allreduce(torch.ones(100)).wait()
            except RuntimeError as e:
                assert "injected for the test" in str(e), e
            else:
                raise AssertionError("a later future completed after the panic")
        dist.barrier()
        os._exit(0)
    elif role == "diloco":
        out = args[0]

        def run(steps, resume_from=None, record=True):
            model = _model()
            inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
            if resume_from is not None:
                model.load_state_dict(torch.load(resume_from + "-model"))
            wrapper = syncopate.torch.DiLoCo(
                model, inner, every=2, outer_lr=0.7, outer_momentum=0.9, state=state
            )
            if resume_from is not None:
                wrapper.load_state_dict(torch.load(resume_from + "-diloco"))
            elif record:
                np.save(os.path.join(out, f"diloco-initial-{rank}.npy"), _flat(model))
            outer_step = wrapper.outer_step

            def recorded():
                k = wrapper.inner_steps // 2
                if record:
                    np.save(os.path.join(out, f"diloco-pre-{k}-{rank}.npy"), _flat(model))
                outer_step()
                if record:
                    np.save(os.path.join(out, f"diloco-post-{k}-{rank}.npy"), _flat(model))

            wrapper.outer_step = recorded
            for step in range(wrapper.inner_steps, steps):
                x, y = _batch(rank, step)
                wrapper.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                wrapper.step()
                if step == 1 and record:
                    ckpt = os.path.join(out, f"ckpt-{rank}")
                    torch.save(model.state_dict(), ckpt + "-model")
                    torch.save(wrapper.state_dict(), ckpt + "-diloco")
            return _flat(model)

        state = syncopate.torch.SyncopateState()
        np.save(os.path.join(out, f"diloco-final-{rank}.npy"), run(6))
        resumed = run(6, resume_from=os.path.join(out, f"ckpt-{rank}"), record=False)
        np.save(os.path.join(out, f"diloco-resumed-{rank}.npy"), resumed)
        state.close()
    elif role == "cuda":
        from torch.nn.parallel import DistributedDataParallel as DDP

        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        state = syncopate.torch.SyncopateState()
        # GPU and CPU tensors, strided views and halves, all in flight at once: every rank
        # starts them in the order asked, and each future waits for its copy back.
        base = torch.zeros(40, device=device)
        tensors = [
            torch.full((3_000_000,), rank + 1.0, device=device),
            torch.full((1000,), rank + 1.0),
            base[::2].fill_(rank + 1.0),
            (torch.arange(3000, device=device).remainder(64) * (rank + 1)).to(torch.bfloat16),
            torch.full((5000,), rank + 1.0, device=device, dtype=torch.float16),
        ]
        expected = [t.float().cpu() * 1.5 / (rank + 1) for t in tensors]
        futures = [state.allreduce(t) for t in tensors]
        for t, f, want in zip(tensors, futures, expected):
            got = f.wait()
            assert got.data_ptr() == t.data_ptr() and got.dtype == t.dtype
            assert torch.equal(got.float().cpu(), want), (t.dtype, t.device, got[:4])
        assert torch.equal(base[1::2].cpu(), torch.zeros(20))
        # DDP on the GPU, against Gloo's on the same GPU.
        weights = {}
        for backend in ("gloo", "syncopate"):
            model = _model().to(device)
            ddp = DDP(model, device_ids=[device.index], bucket_cap_mb=0.004)
            if backend == "syncopate":
                ddp.register_comm_hook(state, syncopate.torch.allreduce_hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for step in range(STEPS):
                x, y = _batch(rank, step)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
                opt.step()
            weights[backend] = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
        assert torch.allclose(weights["gloo"], weights["syncopate"], rtol=1e-5, atol=1e-6)
        state.close()
        print("ok", flush=True)
    elif role == "train-forever":
        state = syncopate.torch.SyncopateState(peer_timeout=5.0)
        _train(_ddp(_model(), state), None, rank, lambda s: print(f"step {s}", flush=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2:])
