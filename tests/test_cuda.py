"""Training on a CUDA GPU: the captured step, the compressors and the aggregation on the device, and what stays
device-independent (checkpoints, the wire, model.pt). Skipped where torch sees no GPU; everything else the
suite runs on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sluice.config import load_config
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.tasks import client_datasets, load_task

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MNIST = ["task.name=mnist_cnn", "train.participation=0.1", "train.local_epochs=2", "train.batch_size=10",
         "train.lr=0.05"]


def _learner(sets: list[str], device: str) -> tuple[Learner, list]:
    cfg = load_config(None, [*sets, f"train.device={device}"], HFLConfig)
    task = load_task(cfg.task, seed=0, data=cfg.data)
    learner = Learner(task, 0, device)
    return learner, learner.check(client_datasets(task, cfg.data, seed=0)[:2])


@pytest.mark.parametrize("task", ["mnist_cnn", "digits_cnn"])
def test_the_captured_step_trains_as_the_eager_step_and_the_cpu(task):
    sets = [f"task.name={task}"]
    gpu, data = _learner(sets, "cuda")
    cpu, cpu_data = _learner(sets, "cpu")
    kw = dict(epochs=3, batch_size=7, lr=0.05, seed=11)  # 7 does not divide the shard: a last eager batch
    graph = gpu.fit(gpu.theta0, gpu.buffers0 if gpu.num_buffers else None, data[0], **kw)
    assert gpu._graphs and all(g is not None for g in gpu._graphs.values()), "the step was not captured"
    gpu.cuda_graphs = False
    eager = gpu.fit(gpu.theta0, gpu.buffers0 if gpu.num_buffers else None, data[0], **kw)
    ref = cpu.fit(cpu.theta0, cpu.buffers0 if cpu.num_buffers else None, cpu_data[0], **kw)
    def diff(a, b):
        return float(np.abs(a[0] - b[0]).max() / np.abs(ref[0]).max())

    print(f"graph/eager {diff(graph, eager):.2e}, graph/cpu {diff(graph, ref):.2e}, eager/cpu {diff(eager, ref):.2e}")
    assert diff(graph, eager) < 5e-3  # the same kernels, up to cuDNN's non-deterministic reductions
    for got in (graph, eager):  # PyTorch runs convolutions in TF32 on a GPU by default: about 1e-3 a step
        assert diff(got, ref) < 5e-2
        assert got[1] == pytest.approx(ref[1], rel=1e-2)
        if ref[2] is not None:
            np.testing.assert_allclose(got[2], ref[2], rtol=5e-2, atol=1e-3)


def test_delta_stays_on_the_device_and_the_upload_is_decoded_on_the_cpu():
    learner, data = _learner(MNIST, "cuda")
    delta, _, _ = learner.fit(learner.theta0, None, data[0], epochs=1, batch_size=10, lr=0.05, seed=0,
                              on_device=True)
    assert delta.device.type == "cuda" and delta.dtype == torch.float64


def test_a_gpu_federation_learns_like_the_cpu_one_and_saves_device_independent_state():
    sets = [*MNIST, "train.local_epochs=5", "seed=1"]
    runs = {}
    for device in ("cpu", "cuda"):
        engine = HFLEngine(load_config(None, [*sets, f"train.device={device}"], HFLConfig))
        runs[device] = (engine, [engine.iterate() for _ in range(7)])  # CPU, seed 1: 0.68 at round 7
    acc = {d: events[-1].metrics["test_accuracy"] for d, (_, events) in runs.items()}
    assert acc["cpu"] > 0.4 and abs(acc["cpu"] - acc["cuda"]) < 0.2, acc
    up = {d: sum(e.bytes_up for e in events) for d, (_, events) in runs.items()}
    assert abs(up["cuda"] - up["cpu"]) < 0.05 * up["cpu"], up
    engine = runs["cuda"][0]
    assert engine.server.device.type == "cuda"
    buf = engine.checkpoint()  # numpy only: a CPU engine takes it
    cpu_engine = HFLEngine(load_config(None, [*sets, "train.device=cpu"], HFLConfig))
    cpu_engine.restore(buf)
    np.testing.assert_array_equal(cpu_engine.params, engine.params)
    on_cpu = cpu_engine.iterate()
    engine.restore(buf)  # and back onto the GPU: the residuals move there again
    on_gpu = engine.iterate()
    assert on_cpu.metrics["test_accuracy"] > 0.4 and on_gpu.metrics["test_accuracy"] > 0.4


def test_sluice_run_on_cuda_writes_a_model_that_loads_on_the_cpu(tmp_path):
    from sluice.cli import main

    assert main(["run", "--set", "train.device=cuda", "--set", "train.rounds=3", "--out", str(tmp_path)]) == 0
    state = torch.load(tmp_path / "model.pt", map_location="cpu", weights_only=True)
    tensors = state.values() if isinstance(state, dict) else [state]
    assert all(t.device.type == "cpu" for t in tensors if isinstance(t, torch.Tensor))


def test_a_gpu_index_that_does_not_exist_is_refused():
    from sluice.errors import ConfigError
    from sluice.models.device import resolve_device

    with pytest.raises(ConfigError, match="CUDA GPU"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_split_parties_train_on_the_gpu_as_on_the_cpu():
    """``train.device`` for split training: every party's parts and rows on the GPU, tensors travel from the
    CPU; the pipelined updates match the CPU's full-batch reference (TF32 convolutions: a loose tolerance)."""
    from sluice.split import SplitConfig, reference_train, run_inprocess

    base = {"task": {"factory": "split_user_tasks:conv"}, "followers": 2,
            "train": {"steps": 4, "batch_size": 40, "eval_every": 2, "lr": 0.05},
            "transport": {"kind": "inproc", "timeout_s": 120}, "pipeline": {"groups": 3}}
    gpu = run_inprocess(SplitConfig.model_validate({**base, "train": {**base["train"], "device": "cuda"}}))
    ref, _ = reference_train(SplitConfig.model_validate(base), 4)
    diff = max(float((gpu.states[p][k].cpu().double() - ref[p][k].double()).abs().max()) for p in ref for k in ref[p])
    assert diff < 1e-3 and "test_accuracy" in gpu.records[-1]
