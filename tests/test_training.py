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


# --- exercises: the reference passes, every planted bug alone is rejected --------------------

from course_utils import exercises  # noqa: E402
from course_utils.training import check_accumulate_step, check_predict_batches, check_train_loop  # noqa: E402


def _loop_step_before_backward(model, loader, loss_fn, optimizer, epochs):   # planted bug 1 alone
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            optimizer.step()
            loss.backward()
            losses.append(loss.item())
    return losses


def _loop_without_zero_grad(model, loader, loss_fn, optimizer, epochs):      # planted bug 2 alone
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def _loop_returning_tensors(model, loader, loss_fn, optimizer, epochs):
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss)
    return losses


def test_train_loop_check_accepts_the_reference(learner):
    assert check_train_loop(exercises.reference("train_loop"))


@pytest.mark.parametrize("variant, symptom", [(_loop_step_before_backward, "no weight changed"),
                                              (_loop_without_zero_grad, "a correct loop reaches"),
                                              (_loop_returning_tensors, "Python floats")])
def test_train_loop_check_rejects_each_planted_bug(learner, variant, symptom):
    verdict = check_train_loop(variant)
    assert not verdict and symptom in str(verdict)


def _loop_as_shipped(model, loader, loss_fn, optimizer, epochs):              # both planted bugs
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            optimizer.step()
            loss.backward()
            losses.append(loss.item())
    return losses


def test_train_loop_check_explains_the_in_place_error_of_the_shipped_loop(learner):
    verdict = check_train_loop(_loop_as_shipped)
    assert not verdict
    assert "the backward() of batch 2 raised RuntimeError" in str(verdict)     # batch 1's step had no gradient
    assert "updated the weights in place after that batch's forward pass" in str(verdict)


def test_train_loop_check_reports_an_exception(learner):
    def raises(model, loader, loss_fn, optimizer, epochs):
        raise KeyError("oops")
    verdict = check_train_loop(raises)
    assert not verdict and "raised KeyError" in str(verdict)


def _accumulate_undivided(model, micro_batches, loss_fn, optimizer):        # planted bug 1 alone
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        loss_fn(model(inputs), targets).backward()
    optimizer.step()


def _accumulate_stepping_every_micro_batch(model, micro_batches, loss_fn, optimizer):   # planted bug 2 alone
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        (loss_fn(model(inputs), targets) / len(micro_batches)).backward()
        optimizer.step()


def test_accumulate_step_check_accepts_the_reference(learner):
    assert check_accumulate_step(exercises.reference("accumulate_step"))


@pytest.mark.parametrize("variant, symptom", [(_accumulate_undivided, "4.00x as large"),
                                              (_accumulate_stepping_every_micro_batch, "ran 4 times")])
def test_accumulate_step_check_rejects_each_planted_bug(learner, variant, symptom):
    verdict = check_accumulate_step(variant)
    assert not verdict and symptom in str(verdict)


def _predict_without_eval(model, batches):                                   # planted bug 1 alone
    with torch.no_grad():
        return torch.cat([model(inputs) for inputs in batches])


def _predict_without_no_grad(model, batches):                                # planted bug 2 alone
    model.eval()
    return torch.cat([model(inputs) for inputs in batches])


def test_predict_batches_check_accepts_the_reference_and_no_grad(learner):
    assert check_predict_batches(exercises.reference("predict_batches"))

    def with_no_grad(model, batches):
        model.eval()
        with torch.no_grad():
            return torch.cat([model(inputs) for inputs in batches])
    assert check_predict_batches(with_no_grad)


@pytest.mark.parametrize("variant, symptoms", [(_predict_without_eval, ["different outputs", "running_mean"]),
                                               (_predict_without_no_grad, ["require grad"])])
def test_predict_batches_check_rejects_each_planted_bug(learner, variant, symptoms):
    verdict = check_predict_batches(variant)
    assert not verdict and all(s in str(verdict) for s in symptoms)


@pytest.mark.parametrize("check, wrong", [
    (check_train_loop, lambda model, loader, loss_fn, optimizer, epochs: None),
    (check_accumulate_step, lambda model, micro_batches, loss_fn, optimizer: None),
    (check_predict_batches, lambda model, batches: [model(x) for x in batches]),
    (check_predict_batches, lambda model, batches: 1 / 0),
])
def test_checks_report_what_they_saw_and_never_crash(learner, check, wrong):
    verdict = check(wrong)
    assert not verdict and "(attempt 1)" in str(verdict)


def test_a_long_error_is_cut_to_one_short_line(learner):
    def raises(model, loader, loss_fn, optimizer, epochs):
        raise RuntimeError("word " * 100 + "\nsecond line")
    message = str(check_train_loop(raises)).splitlines()[0]
    assert message.endswith("…") and "second line" not in message and len(message) < 200
