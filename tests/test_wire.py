"""What crosses Ray's object store between the driver and a worker actor
(fedsim.remote.wire): an update's tensors as out-of-band buffers, one per
tensor and nothing of them in the pickle stream, arriving as the same bits
in writable tensors of the receiver's own. Pickle 5 with a buffer callback
is what Ray runs, so no Ray is started here; the counts below (buffers,
stream bytes) are what a change that pickled the model through torch again
would break."""

from __future__ import annotations

import pickle

import pytest
import torch

from fedsim import tasks
from fedsim.algorithms.base import ClientUpdate
from fedsim.data import build_data
from fedsim.params import l2_norm
from fedsim.remote.executor import RayWorker, _own
from fedsim.remote.wire import ship, ship_update
from fedsim.runtime import run_setup
from fedsim.scenario import load_scenario
from fedsim.server import Server
from fedsim.workers import Task, Worker

from .conftest import SCENARIOS

D = 100_000  # floats: 400 kB, far above any stream overhead


def send(value: object) -> tuple[object, int, list[pickle.PickleBuffer]]:
    """``value`` through pickle 5 as Ray sends it: (what arrives, the
    in-band stream's bytes, the out-of-band buffers)."""
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    # Ray hands the reader read-only views of the store
    views = [memoryview(b).toreadonly() for b in buffers]
    return pickle.loads(stream, buffers=views), len(stream), buffers


def an_update() -> ClientUpdate:
    gen = torch.Generator().manual_seed(0)
    return ClientUpdate(
        client=4,
        delta=torch.randn(D, generator=gen),
        weight=2.5,
        tau=7,
        norm_a=7.0,
        train_loss=0.25,
        extras={"dc": torch.randn(D, generator=gen, dtype=torch.float64)},
        new_state={"c": torch.randn(D, generator=gen), "n": torch.tensor(3)},
    )


def test_an_update_crosses_out_of_band_with_the_same_bits():
    # Prepare
    u = an_update()
    # Execute
    got, stream, buffers = send(ship_update(u))
    # Assert: one buffer per tensor, the stream holds none of their bytes
    assert isinstance(got, ClientUpdate)
    assert len(buffers) == 4
    assert stream < 2_000
    assert (got.client, got.weight, got.tau, got.norm_a, got.train_loss) == (
        4, 2.5, 7, 7.0, 0.25
    )  # fmt: skip
    pairs = [(got.delta, u.delta), (got.extras["dc"], u.extras["dc"])]
    pairs += [(got.new_state[k], u.new_state[k]) for k in u.new_state]
    for back, sent in pairs:
        assert back.dtype == sent.dtype and torch.equal(back, sent)
        # the receiver's own memory, writable (not a view of the store)
        assert back.data_ptr() != sent.data_ptr()
        back.add_(1)
    assert not torch.equal(got.delta, u.delta)  # the sender's update unchanged


def test_the_torch_pickle_it_replaces_puts_the_model_in_the_stream():
    # the count the guard above rests on: unshipped, the delta is in band
    _, stream, buffers = send(an_update())
    assert not buffers and stream > 4 * D


@pytest.mark.parametrize(
    "tensor",
    [
        torch.ones(5, dtype=torch.bfloat16),  # NumPy has no bfloat16
        torch.ones(5, requires_grad=True),
        torch.nn.Parameter(torch.ones(5)),
        torch.ones(5, dtype=torch.complex64).conj(),  # a conjugate view
    ],
    ids=["bfloat16", "requires_grad", "parameter", "conjugate"],
)
def test_what_numpy_cannot_hold_travels_as_torch_pickles_it(tensor):
    assert ship(tensor) is tensor
    got, _, buffers = send(ship(tensor))
    assert not buffers and type(got) is type(tensor)
    assert torch.equal(got.detach().resolve_conj(), tensor.detach().resolve_conj())


def test_a_ray_worker_ships_its_updates_and_a_call_its_states():
    # Prepare: the actor class itself, set up in this process (no Ray)
    sc = load_scenario(SCENARIOS / "quickstart.yaml", ["algorithm={name: scaffold}"])
    setup = run_setup(sc)
    data = build_data(sc.data, sc.num_clients, sc.seed)
    payload = Server(setup.server, data).payload()
    tasks = [Task(3, 0, 4), Task(8, 0, 2)]
    states = {3: {"c": torch.full_like(payload["x"], 0.01)}}
    actor = RayWorker()
    actor.setup_for(setup.executor.worker, data, 1, token="run")
    # Execute
    got, stream, buffers = send(actor.train(payload, tasks, states, token="run"))
    apart, _, apart_buffers = send(actor.train_apart(payload, tasks, states))
    sent, _, state_buffers = send(_own(tasks, states))
    # Assert: SCAFFOLD's delta, dc and new c_i per update, out of band, the
    # same bits as an in-process worker's
    want = Worker(setup.executor.worker, data, 1).train(payload, tasks, states)
    assert len(buffers) == len(apart_buffers) == 3 * len(tasks)
    assert stream < 2_000 * len(tasks)
    for ups in (got, apart[1:]):
        for g, w in zip(ups, want, strict=True):
            assert torch.equal(g.delta, w.delta)
            assert torch.equal(g.extras["dc"], w.extras["dc"])
            assert torch.equal(g.new_state["c"], w.new_state["c"])
    assert [s.client for s in apart[0]] == [3, 8]
    assert len(state_buffers) == 1 and torch.equal(sent[3]["c"], states[3]["c"])


def counting_norms(monkeypatch) -> list[int]:
    """Count the float64 norm passes fedsim.tasks makes from now on."""
    calls = [0]
    real = tasks.l2_norm

    def counted(v: torch.Tensor) -> float:
        calls[0] += 1
        return real(v)

    monkeypatch.setattr(tasks, "l2_norm", counted)
    return calls


def test_a_shipped_delta_arrives_with_the_norm_its_worker_computed(monkeypatch):
    # Prepare
    u = an_update()
    calls = counting_norms(monkeypatch)
    # Execute: the worker ships (one norm pass there), the driver reads twice
    got, _, _ = send(ship_update(u))
    on_worker = calls[0]
    norms = [tasks.update_norm(got), tasks.update_norm(got)]
    # Assert: the driver made no pass of its own, and the norm is the bits
    # of its own computation
    assert on_worker == 1 and calls[0] == 1
    assert norms == [l2_norm(u.delta)] * 2


def test_a_norm_is_computed_once_per_delta_and_again_after_a_change(monkeypatch):
    u = an_update()
    calls = counting_norms(monkeypatch)
    first = [tasks.update_norm(u), tasks.update_norm(u)]
    assert calls[0] == 1 and first == [l2_norm(u.delta)] * 2
    u.delta.mul_(2)  # in place: the version counter moves
    assert tasks.update_norm(u) == l2_norm(u.delta) != first[0]
    assert calls[0] == 2
