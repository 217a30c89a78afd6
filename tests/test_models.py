"""Model registry: parameter counts from the papers, shapes, seeded init,
and training through the flat parameter vector."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.data.base import FederatedData
from fedsim.models import (
    MODELS,
    NetworkSetup,
    batch_loss,
    build_model,
    evaluate,
    make_model,
)
from fedsim.params import bind_flat
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.spec import Model

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"

# name, sample shape, classes, parameters
CASES = [
    ("logreg", (60,), 10, 610),
    ("mlp", (1, 28, 28), 10, 199_210),  # 784-200-200-10 (FedDC's MNIST MLP)
    ("cnn", (1, 28, 28), 10, 1_663_370),  # FedAvg paper, section 3
    ("cnn_m", (1, 28, 28), 10, 21_840),  # FedPNS CNN-M (tests/test_models_fedpns.py)
    ("cifar_cnn", (3, 32, 32), 10, 797_962),  # FedDC code (docs/algorithms.md 9.3)
    ("convnet", (3, 32, 32), 10, 320_010),  # FedDM (docs/algorithms.md 10.2)
    ("convnet", (1, 28, 28), 10, 317_706),
    ("vgg11", (3, 32, 32), 10, 9_756_426),
    ("resnet18", (3, 32, 32), 10, 11_173_962),  # the usual CIFAR ResNet-18
    ("resnet18", (3, 64, 64), 200, 11_279_112),  # torchvision's stem (Tiny ImageNet)
    ("lstm", (80,), 80, 819_920),  # LEAF Shakespeare: embed 8, 2 x LSTM 256
]


def _inputs(name, shape, classes, batch=3):
    g = torch.Generator().manual_seed(0)
    if name == "lstm":
        return torch.randint(0, classes, (batch, *shape), generator=g).float()
    return torch.randn(batch, *shape, generator=g)


@pytest.mark.parametrize(("name", "shape", "classes", "count"), CASES)
def test_parameter_count_and_output_shape(name, shape, classes, count):
    model = build_model(MODELS[name](), 0, classes, seed=0, input_shape=shape)

    assert sum(p.numel() for p in model.parameters()) == count
    out = model(_inputs(name, shape, classes))
    assert out.shape == (3, classes) and out.dtype == torch.float32


def test_every_registered_model_is_tested():
    # (quadratic: tests/test_quadratic.py and the formula test of
    # tests/test_cli_startup.py)
    assert {c[0] for c in CASES} | {"quadratic"} == set(MODELS)
    assert all(MODELS[name]().name == name for name in MODELS)


def test_flat_image_rows_are_reshaped():
    model = build_model(MODELS["cnn"](), 784, 10, seed=0)  # no shape: 1x28x28
    x = torch.randn(2, 1, 28, 28)

    torch.testing.assert_close(model(x.reshape(2, 784)), model(x))


def test_convnet_embedding_is_the_classifier_input():
    model = build_model(MODELS["convnet"](), 0, 10, 0, input_shape=(3, 32, 32))
    x = torch.randn(2, 3, 32, 32)

    assert model.embed(x).shape == (2, 2048)
    torch.testing.assert_close(model.classifier(model.embed(x)), model(x))


def test_seeded_init_without_touching_the_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model(MODELS["cifar_cnn"](), 0, 10, seed=5, input_shape=(3, 32, 32))
    after = torch.rand(1)
    b = build_model(MODELS["cifar_cnn"](), 0, 10, seed=5, input_shape=(3, 32, 32))
    c = build_model(MODELS["cifar_cnn"](), 0, 10, seed=6, input_shape=(3, 32, 32))

    assert torch.equal(before, after)
    pa, pb, pc = (
        torch.nn.utils.parameters_to_vector(m.parameters()) for m in (a, b, c)
    )
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_group_norm_instead_of_batch_norm():
    for name in ("vgg11", "resnet18"):
        model = build_model(MODELS[name](), 0, 10, 0, input_shape=(3, 32, 32))
        kinds = {type(m).__name__ for m in model.modules()}
        assert "GroupNorm" in kinds and "BatchNorm2d" not in kinds
        assert "Dropout" not in kinds


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="needs >= 32x32"):
        build_model(MODELS["vgg11"](), 0, 10, 0, input_shape=(1, 28, 28))
    with pytest.raises(ValueError, match=r"needs images \[C, H, W\]"):
        build_model(MODELS["cnn"](), 60, 10, 0)
    with pytest.raises(ValueError, match="classes"):
        build_model(MODELS["mlp"](), 60, 0, 0)


@pytest.mark.parametrize(
    ("name", "shape", "classes"),
    [("cnn", (1, 28, 28), 10), ("lstm", (20,), 30), ("convnet", (3, 32, 32), 10)],
)
def test_training_through_the_flat_vector(name, shape, classes):
    small = {"lstm": {"lstm_hidden": 32}, "convnet": {"width": 16}}
    model = build_model(
        MODELS[name](**small.get(name, {})),
        0,
        classes,
        seed=0,
        input_shape=shape,
    )
    theta, grad = bind_flat(model)
    x = _inputs(name, shape, classes, batch=8)
    y = torch.arange(8) % classes
    start = theta.clone()
    losses = []
    for _ in range(15):
        grad.zero_()
        loss = batch_loss(model, x, y)
        loss.backward()
        if not losses:  # every parameter gets a gradient, in the flat buffer
            for p in model.parameters():
                assert p.grad.data_ptr() >= grad.data_ptr()
                assert float(p.grad.abs().sum()) > 0
        theta.sub_(0.05 * grad)
        losses.append(float(loss.detach()))

    assert not torch.equal(theta, start)
    assert losses[-1] < losses[0]


def test_make_model_uses_the_data_shape():
    data = FederatedData(
        x=np.zeros((4, 3, 32, 32), np.float32),
        y=np.zeros(4, np.int64),
        offsets=np.array([0, 4]),
        weights=np.ones(1),
        test_x=np.zeros((2, 3, 32, 32), np.float32),
        test_y=np.zeros(2, np.int64),
        num_classes=10,
    )

    model = make_model(NetworkSetup(MODELS["cnn"](), seed=0), data)

    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    loss, acc = evaluate(model, torch.zeros(5, 3, 32, 32), torch.zeros(5).long(), 2)
    assert np.isfinite(loss) and 0 <= acc <= 1


# ------------------------------------------- a model's own facts (issue 38)
class HalfCE(Model):
    """A plug-in that declares its own loss: half the cross-entropy."""

    def build(self, input_shape, num_classes):
        return torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(int(np.prod(input_shape)), num_classes)
        )

    def loss(self, outputs, targets):
        return 0.5 * torch.nn.functional.cross_entropy(
            outputs, targets, reduction="none"
        )


def test_a_model_with_its_own_loss_trains_and_is_evaluated_by_it():
    # Prepare
    net = NetworkSetup(HalfCE(), seed=0)
    model = build_model(net.model, 4, 3, seed=0)
    x, y = (
        torch.randn(6, 4, generator=torch.Generator().manual_seed(1)),
        torch.arange(6) % 3,
    )
    ce = torch.nn.functional.cross_entropy(model(x), y)
    # Execute
    trained = batch_loss(model, x, y, net.loss)
    loss, acc = evaluate(model, x, y, batch_size=4, loss=net.loss)
    # Assert: half the cross-entropy; the accuracy of class labels as ever;
    # the built-ins declare no loss but the quadratic objectives'
    torch.testing.assert_close(trained, 0.5 * ce)
    assert loss == pytest.approx(0.5 * float(ce.detach()), rel=1e-6)
    assert acc == int((model(x).argmax(1) == y).sum()) / 6
    assert NetworkSetup(MODELS["logreg"](), 0).loss is None
    assert [n for n, c in MODELS.items() if c().own_loss] == ["quadratic"]


def test_a_section_of_the_old_all_in_one_spec_is_refused_naming_whose_field():
    # Prepare: a resolved scenario.yaml of earlier versions listed every
    # network's fields at their defaults
    old = "model={name: logreg, hidden: [200, 200], depth: 3, zero_init: true}"
    # Execute
    with pytest.raises(ScenarioError) as err:
        load_scenario(QUICK, [old])
    # Assert: one line saying whose field it is and what logreg reads
    line = str(err.value).splitlines()[-1]
    assert "hidden is a field of mlp, not of logreg" in line
    assert "reads only its own (dtype, zero_init)" in line
    # a field no network has is still a misspelling
    with pytest.raises(ScenarioError, match=r"model\.hiden: unknown key"):
        load_scenario(QUICK, ["model={name: logreg, hiden: [7]}"])
