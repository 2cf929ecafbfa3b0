"""Chapter 2: train_step, train_accumulated, evaluate and fit, checked against plain PyTorch."""
import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_utils.models import mlp
from course_utils.training import History, evaluate, fit, train_accumulated, train_step


@pytest.fixture
def problem():
    x = torch.randn(32, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return mlp([4, 16, 1]), (x, y), nn.MSELoss()


def test_train_step_matches_the_textbook_step_and_returns_a_float(problem):
    model, batch, loss_fn = problem
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    loss = train_step(model, batch, loss_fn, opt)
    ref_opt.zero_grad()
    ref_loss = loss_fn(reference(batch[0]), batch[1])
    ref_loss.backward()
    ref_opt.step()
    assert isinstance(loss, float) and loss == pytest.approx(ref_loss.item())
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_train_step_clips_before_stepping(problem):
    model, batch, loss_fn = problem
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    train_step(model, (batch[0], batch[1] * 1000), loss_fn, opt, max_norm=1.0)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert norm.item() == pytest.approx(1.0, rel=1e-4)


def test_train_step_with_grad_scaler_on_cpu(problem):
    model, batch, loss_fn = problem
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    before = [p.detach().clone() for p in model.parameters()]
    loss = train_step(model, batch, loss_fn, opt, max_norm=1.0, scaler=scaler)
    assert isinstance(loss, float)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_train_step_copies_a_pinned_batch_without_blocking_and_gets_the_same_weights(problem, monkeypatch):
    model, (x, y), loss_fn = problem
    model, reference = model.cuda(), copy.deepcopy(model).cuda()
    calls = []
    copy_to = torch.Tensor.to

    def recording_to(tensor, *args, **kwargs):
        if tensor.device.type == "cpu":                  # a host-to-device copy of the batch
            calls.append(kwargs.get("non_blocking", False))
        return copy_to(tensor, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    train_step(model, (x.pin_memory(), y.pin_memory()), loss_fn, torch.optim.SGD(model.parameters(), lr=0.1))
    assert calls == [True, True]
    calls.clear()
    train_step(reference, (x, y), loss_fn, torch.optim.SGD(reference.parameters(), lr=0.1))
    assert calls == [False, False]                       # pageable memory: a plain copy
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_train_step_bad_batch(problem):
    model, _, loss_fn = problem
    with pytest.raises(TypeError, match=r"\(inputs, targets\) pair"):
        train_step(model, torch.zeros(3, 4), loss_fn, torch.optim.SGD(model.parameters(), lr=0.1))


def test_train_step_model_without_parameters():
    with pytest.raises(ValueError, match="no registered parameters"):
        train_step(nn.ReLU(), (torch.zeros(1), torch.zeros(1)), nn.MSELoss(), None)


@pytest.mark.parametrize("sizes", [[8, 8, 8, 8], [10, 10, 12]])
def test_accumulated_gradients_equal_one_big_batch(problem, sizes):
    model, (x, y), loss_fn = problem
    big = copy.deepcopy(model)
    big_loss = loss_fn(big(x), y)
    big_loss.backward()
    captured = {}
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    opt.step = lambda: captured.update({n: p.grad.clone() for n, p in model.named_parameters()})
    micro = list(zip(x.split(sizes), y.split(sizes)))
    loss = train_accumulated(model, micro, loss_fn, opt)
    assert loss == pytest.approx(big_loss.item(), rel=1e-5)
    for name, p in big.named_parameters():
        torch.testing.assert_close(captured[name], p.grad, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())  # zero_grad after the step


def test_accumulated_rejects_empty(problem):
    model, _, loss_fn = problem
    with pytest.raises(ValueError, match="empty"):
        train_accumulated(model, [], loss_fn, torch.optim.SGD(model.parameters(), lr=0.1))


def test_evaluate_weights_by_batch_size_and_restores_mode(problem):
    model, (x, y), loss_fn = problem
    model.train()
    loader = DataLoader(TensorDataset(x[:30], y[:30]), batch_size=8)  # last batch of 6
    with torch.no_grad():
        expected = loss_fn(model.eval()(x[:30]), y[:30]).item()
    model.train()
    assert evaluate(model, loader, loss_fn) == pytest.approx(expected, rel=1e-5)
    assert model.training
    model.eval()
    evaluate(model, loader, loss_fn)
    assert not model.training


def test_evaluate_empty_loader(problem):
    model, _, loss_fn = problem
    with pytest.raises(ValueError, match="no samples"):
        evaluate(model, [], loss_fn)


def test_fit_lowers_the_loss_and_records_history(problem):
    model, (x, y), loss_fn = problem
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.97)
    history = fit(model, loader, loss_fn, opt, epochs=30, val_loader=loader, scheduler=sched, progress=False)
    assert isinstance(history, History)
    assert len(history.train_losses) == 30 * 4 and len(history.val_losses) == 30
    assert history.val_losses[-1] < 0.2 * history.val_losses[0]
    assert sched.last_epoch == 30
    with pytest.raises(ValueError, match="epochs"):
        fit(model, loader, loss_fn, opt, epochs=0)
