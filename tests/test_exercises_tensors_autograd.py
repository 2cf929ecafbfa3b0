"""Chapter 1 exercises: every check rejects plausible wrong answers and accepts more than one right one.

For each exercise: WRONG answers (the planted bug left in, an answer tuned to the sizes a learner would
try, the right numbers computed the wrong way) must each be rejected, with a first verdict that says what
was observed and names no fix; the reference and a differently written correct answer must pass.
"""
import pytest
import torch

from course_utils import (check_fit_linear_by_hand, check_line_parameters, check_per_loss_gradients, check_sgd_update,
                          check_slopes_of_cube, check_two_branch_forward)
from course_utils.exercises import reference

# Words that would give the fix away in a first verdict (hints may use them later).
FIX_WORDS = ("no_grad", "zero_()", "retain_graph", "keepdim", "requires_grad_()", "detach", ".sum()",
             "gradient=", "clone")


def _first_verdict_is_an_observation(verdict) -> str:
    """The verdict of a first failed attempt: an observation, no hint, no fix."""
    text = str(verdict)
    assert not verdict and "(attempt 1)" in text and "hint 1" not in text and "not attempted" not in text, text
    observed = text.splitlines()[0]
    assert not any(word in observed for word in FIX_WORDS), observed
    return observed


# --- exercise 1: slopes_of_cube ----------------------------------------------------------------

def _by_hand(xs):
    return 3 * xs ** 2


def _backward_on_the_vector(xs):             # the non-scalar backward: raises
    t = xs.detach().clone().requires_grad_()
    (t ** 3).backward()
    return t.grad


def _mean_instead_of_sum(xs):                # v = 1/N: every slope N times too small
    t = xs.detach().clone().requires_grad_()
    (t ** 3).mean().backward()
    return t.grad


def _ones_of_size_seven(xs):                  # tuned to a 7-point example: other shapes fail
    t = xs.detach().clone().requires_grad_()
    (t ** 3).backward(gradient=torch.ones(7, device=xs.device, dtype=xs.dtype))
    return t.grad


def _one_backward_per_point(xs):              # right numbers, N backward passes
    t = xs.detach().clone().requires_grad_()
    for point in t.flatten():
        (point ** 3).backward()
    return t.grad


def _as_float32(xs):                          # right method, the input's dtype lost
    t = torch.tensor(xs.tolist(), device=xs.device, requires_grad=True)
    (t ** 3).sum().backward()
    return t.grad


def _finite_difference(xs):                   # the right numbers, no autograd
    eps = 1e-6
    return ((xs + eps) ** 3 - (xs - eps) ** 3) / (2 * eps)


SLOPES_WRONG = {"derivative by hand": _by_hand, "backward() on the vector (the bug)": _backward_on_the_vector,
                "mean instead of sum": _mean_instead_of_sum, "gradient sized for 7 points": _ones_of_size_seven,
                "one backward per point": _one_backward_per_point, "float64 turned into float32": _as_float32,
                "finite differences": _finite_difference}


@pytest.mark.parametrize("name", SLOPES_WRONG)
def test_check_slopes_of_cube_rejects(name, learner):
    _first_verdict_is_an_observation(check_slopes_of_cube(SLOPES_WRONG[name]))


def _with_autograd_grad(xs):
    t = xs.detach().clone().requires_grad_()
    return torch.autograd.grad(t ** 3, t, grad_outputs=torch.ones_like(t))[0]


def _with_gradient_argument(xs):
    t = xs.detach().requires_grad_()
    t.pow(3).backward(gradient=torch.ones_like(t))
    return t.grad


@pytest.mark.parametrize("answer", [reference("slopes_of_cube"), _with_autograd_grad, _with_gradient_argument])
def test_check_slopes_of_cube_accepts(answer, learner):
    assert check_slopes_of_cube(answer)


def test_check_slopes_of_cube_says_what_it_saw(learner):
    assert "not attempted" in str(check_slopes_of_cube(lambda xs: None))
    assert "grad can be implicitly created only for scalar outputs" in str(
        check_slopes_of_cube(_backward_on_the_vector))
    assert "autograd computed none of them" in str(check_slopes_of_cube(_by_hand))
    assert "asked autograd 7 times for 7 points" in str(check_slopes_of_cube(_one_backward_per_point))
    assert "torch.float32, expected torch.float64" in str(check_slopes_of_cube(_as_float32))


# --- exercise 2: sgd_update --------------------------------------------------------------------

def _rebinds(params, lr):
    for p in params:
        p = p - lr * p.grad  # noqa: F841  (the classic mistake: the leaf is untouched)


def _forgets_zero(params, lr):
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad


def _zero_before_update(params, lr):
    with torch.no_grad():
        for p in params:
            p.grad.zero_()
            p -= lr * p.grad


def _outside_no_grad(params, lr):
    for p in params:
        p -= lr * p.grad
        p.grad.zero_()


def _two_tensors_only(params, lr):            # tuned to the chapter's w and b
    w, b = params
    reference("sgd_update")([w, b], lr)


def _replaces_the_tensors(params, lr):        # right numbers, in new tensors the caller does not hold
    for i, p in enumerate(params):
        params[i] = (p - lr * p.grad).detach().requires_grad_()


def _fixed_lr(params, lr):                    # the learning rate of the chapter, not the argument
    reference("sgd_update")(params, 0.05)


SGD_WRONG = {"rebinds a local name": _rebinds, "forgets zero_()": _forgets_zero,
             "zeroes before the update": _zero_before_update, "update outside no_grad": _outside_no_grad,
             "two tensors only": _two_tensors_only, "replaces the tensors in the list": _replaces_the_tensors,
             "ignores lr": _fixed_lr}


@pytest.mark.parametrize("name", SGD_WRONG)
def test_check_sgd_update_rejects(name, learner):
    _first_verdict_is_an_observation(check_sgd_update(SGD_WRONG[name]))


def _set_to_none(params, lr):                 # what optimizer.zero_grad() does by default
    with torch.no_grad():
        for p in params:
            p.sub_(p.grad, alpha=lr)
    for p in params:
        p.grad = None


def _with_torch_optim(params, lr):
    torch.optim.SGD(params, lr=lr).step()
    for p in params:
        p.grad.zero_()


@pytest.mark.parametrize("answer", [reference("sgd_update"), _set_to_none, _with_torch_optim])
def test_check_sgd_update_accepts(answer, learner):
    assert check_sgd_update(answer)


def test_check_sgd_update_says_what_it_saw(learner):
    assert "not attempted" in str(check_sgd_update(lambda params, lr: None))
    assert "the 2×3 matrix did not change" in str(check_sgd_update(_rebinds))
    assert ".grad still holds" in str(check_sgd_update(_forgets_zero))
    assert "a leaf Variable that requires grad is being used in an in-place" in str(check_sgd_update(_outside_no_grad))
    assert "too many values to unpack" in str(check_sgd_update(_two_tensors_only))
    assert "after update 2 (lr 0.2)" in str(check_sgd_update(_fixed_lr))


# --- exercise 3: fit_linear_by_hand -------------------------------------------------------------

def _descent(*, no_grad=True, zero_grad=True, one_feature=False, fixed=None):
    """The exercise's loop with each planted bug switchable, or tuned to the chapter's one feature / lr."""
    def fit(x, y, lr, steps):
        lr, steps = fixed or (lr, steps)
        w = torch.zeros(1 if one_feature else x.shape[1], 1, device=x.device, requires_grad=True)
        b = torch.zeros(1, device=x.device, requires_grad=True)
        losses = []
        for _ in range(steps):
            pred = w.flatten() * x if one_feature else x @ w
            loss = ((pred + b - y) ** 2).mean()
            loss.backward()
            if no_grad:
                with torch.no_grad():
                    w -= lr * w.grad
                    b -= lr * b.grad
            else:
                w -= lr * w.grad
                b -= lr * b.grad
            if zero_grad:
                w.grad.zero_()
                b.grad.zero_()
            losses.append(loss.item())
        return w.flatten().tolist(), b.item(), losses
    return fit


def _closed_form(x, y, lr, steps):            # the least-squares answer, not gradient descent
    design = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)
    solution = torch.linalg.lstsq(design.cpu(), y.cpu()).solution.flatten().tolist()
    loss = ((design @ torch.tensor(solution, device=x.device).reshape(-1, 1) - y) ** 2).mean().item()
    return solution[:-1], solution[-1], [loss] * steps


def _logs_tensors(x, y, lr, steps):
    w, b, losses = reference("fit_linear_by_hand")(x, y, lr, steps)
    return w, b, [torch.tensor(loss) for loss in losses]


FIT_WRONG = {"both bugs left in": _descent(no_grad=False, zero_grad=False),
             "update outside no_grad only": _descent(no_grad=False),
             "grad.zero_() missing only": _descent(zero_grad=False),
             "one feature, as in the chapter": _descent(one_feature=True),
             "lr and steps of the first run": _descent(fixed=(0.1, 300)),
             "closed-form least squares": _closed_form, "losses kept as tensors": _logs_tensors}


@pytest.mark.parametrize("name", FIT_WRONG)
def test_check_fit_linear_by_hand_rejects(name, learner):
    _first_verdict_is_an_observation(check_fit_linear_by_hand(FIT_WRONG[name]))


def _with_set_to_none(x, y, lr, steps):
    w = torch.zeros(x.shape[1], 1, device=x.device, requires_grad=True)
    b = torch.zeros((), device=x.device, requires_grad=True)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(x @ w + b, y)
        w.grad = b.grad = None
        loss.backward()
        with torch.no_grad():
            w.sub_(lr * w.grad)
            b.sub_(lr * b.grad)
        losses.append(loss.item())
    return w.detach().flatten(), b.item(), losses


@pytest.mark.parametrize("answer", [reference("fit_linear_by_hand"), _with_set_to_none])
def test_check_fit_linear_by_hand_accepts(answer, learner):
    assert check_fit_linear_by_hand(answer)


def test_check_fit_linear_by_hand_says_what_it_saw(learner):
    assert "leaf Variable that requires grad is being used in an in-place" in str(
        check_fit_linear_by_hand(FIT_WRONG["both bugs left in"]))
    one_feature = check_fit_linear_by_hand(FIT_WRONG["one feature, as in the chapter"])
    assert "your w has 1 value for 3 features" in str(one_feature)
    fixed_lr = check_fit_linear_by_hand(FIT_WRONG["lr and steps of the first run"])
    assert "returned 300 losses for 40 steps" in str(fixed_lr)
    assert "your losses first differ from the descent's at step 0" in str(check_fit_linear_by_hand(_closed_form))
    assert "grad_fn" in str(check_fit_linear_by_hand(_logs_tensors))


# --- exercise 4: line_parameters ----------------------------------------------------------------

def _parameters(*, scale_after=False, convert_after=False, fixed_dtype=None, fixed_n=None, std=0.01):
    """The exercise's parameters with each planted bug switchable, or tuned to one dtype / size."""
    def make(n_features, dtype, device):
        dtype, n_features = fixed_dtype or dtype, fixed_n or n_features
        if scale_after:
            weight = torch.randn(n_features, 1, dtype=dtype, device=device, requires_grad=True) * std
        else:
            weight = (torch.randn(n_features, 1, dtype=dtype, device=device) * std).requires_grad_()
        if convert_after:
            bias = torch.zeros(1, requires_grad=True).to(device, dtype)
        else:
            bias = torch.zeros(1, dtype=dtype, device=device, requires_grad=True)
        return weight, bias
    return make


PARAMETERS_WRONG = {"both bugs left in": _parameters(scale_after=True, convert_after=True),
                    "scaled after requires_grad": _parameters(scale_after=True),
                    "converted after requires_grad": _parameters(convert_after=True),
                    "always float64": _parameters(fixed_dtype=torch.float64),
                    "always 64 features": _parameters(fixed_n=64),
                    "the scale dropped": _parameters(std=1.0)}


@pytest.mark.parametrize("name", PARAMETERS_WRONG)
def test_check_line_parameters_rejects(name, learner):
    _first_verdict_is_an_observation(check_line_parameters(PARAMETERS_WRONG[name]))


def _as_parameters(n_features, dtype, device):
    weight = torch.nn.Parameter(0.01 * torch.randn(n_features, 1, dtype=dtype, device=device))
    return weight, torch.nn.Parameter(torch.zeros(1, dtype=dtype, device=device))


def _flag_set_last(n_features, dtype, device):
    weight = torch.randn(n_features, 1, device=device).to(dtype).mul(0.01)
    bias = torch.zeros(1).to(device, dtype)
    weight.requires_grad = True
    bias.requires_grad = True
    return weight, bias


@pytest.mark.parametrize("answer", [reference("line_parameters"), _as_parameters, _flag_set_last])
def test_check_line_parameters_accepts(answer, learner):
    assert check_line_parameters(answer)


def test_check_line_parameters_says_what_it_saw(learner):
    scaled = str(check_line_parameters(PARAMETERS_WRONG["scaled after requires_grad"])).splitlines()[0]
    assert "weight is not a leaf (its grad_fn is MulBackward0)" in scaled and "bias" not in scaled
    converted = str(check_line_parameters(PARAMETERS_WRONG["converted after requires_grad"])).splitlines()[0]
    assert "bias is not a leaf (its grad_fn is ToCopyBackward0)" in converted and "weight" not in converted
    assert "std" in str(check_line_parameters(PARAMETERS_WRONG["the scale dropped"]))
    assert "asked for torch.float32" in str(check_line_parameters(PARAMETERS_WRONG["always float64"]))


# --- exercise 5: two_branch_forward -------------------------------------------------------------

def _branches(negative):
    def forward(x, W1, W2):
        h = x @ W1
        if x.mean() > 0:
            return h @ W2
        return negative(h) @ W2
    return forward


TWO_BRANCH_WRONG = {
    "the planted (N, 8) / (N,)": _branches(lambda h: h / h.abs().amax(dim=1)),
    "reshaped for 5 rows": _branches(lambda h: h / h.abs().amax(dim=1).reshape(5, 1)),
    "scale of each column": _branches(lambda h: h / h.abs().amax(dim=0, keepdim=True)),
    "one scale for the batch": _branches(lambda h: h / h.abs().max()),
    "the row scales as a row, (1, N)": _branches(lambda h: h / h.abs().amax(dim=1).unsqueeze(0)),
}


@pytest.mark.parametrize("name", TWO_BRANCH_WRONG)
def test_check_two_branch_forward_rejects(name, learner):
    _first_verdict_is_an_observation(check_two_branch_forward(TWO_BRANCH_WRONG[name]))


@pytest.mark.parametrize("answer", [reference("two_branch_forward"),
                                    _branches(lambda h: h / h.abs().amax(dim=1)[:, None]),
                                    _branches(lambda h: (h.T / h.abs().max(dim=1).values).T)])
def test_check_two_branch_forward_accepts(answer, learner):
    assert check_two_branch_forward(answer)


def test_check_two_branch_forward_says_what_it_saw(learner):
    planted = str(check_two_branch_forward(TWO_BRANCH_WRONG["the planted (N, 8) / (N,)"])).splitlines()[0]
    assert "3 rows with a negative mean: your function raised RuntimeError" in planted
    assert "8 rows with a negative mean: right shape (8, 2), but the values differ" in planted
    assert "positive" not in planted
    tuned = str(check_two_branch_forward(TWO_BRANCH_WRONG["reshaped for 5 rows"])).splitlines()[0]
    assert "3 rows with a negative mean: your function raised RuntimeError" in tuned


# --- exercise 6: per_loss_gradients -------------------------------------------------------------

def _losses(w, x, y):
    h = torch.tanh(x @ w)
    return ((h - y) ** 2).mean(), (h ** 2).mean()


def _shipped(w, x, y):                         # both bugs: graph freed, and .grad read by reference
    fit, penalty = _losses(w, x, y)
    fit.backward()
    grad_fit = w.grad
    penalty.backward()
    return grad_fit, w.grad


def _retain_only(w, x, y):                     # the error gone; both names are the one .grad tensor
    fit, penalty = _losses(w, x, y)
    fit.backward(retain_graph=True)
    grad_fit = w.grad
    penalty.backward()
    return grad_fit, w.grad


def _clone_without_zeroing(w, x, y):           # the penalty's gradient still holds the fit's
    fit, penalty = _losses(w, x, y)
    fit.backward(retain_graph=True)
    grad_fit = w.grad.clone()
    penalty.backward()
    return grad_fit, w.grad.clone()


def _stale_grad_kept(w, x, y):                 # zeroes between the passes, not before: an old step leaks in
    fit, penalty = _losses(w, x, y)
    fit.backward(retain_graph=True)
    grad_fit = w.grad.clone()
    w.grad.zero_()
    penalty.backward()
    return grad_fit, w.grad.clone()


def _summed(w, x, y):                          # one backward of the sum: not separate
    fit, penalty = _losses(w, x, y)
    (fit + penalty).backward()
    return w.grad.clone(), w.grad.clone()


def _two_forwards(w, x, y):                    # the right numbers, the forward run twice
    (grad_fit,) = torch.autograd.grad(_losses(w, x, y)[0], w)
    (grad_penalty,) = torch.autograd.grad(_losses(w, x, y)[1], w)
    return grad_fit, grad_penalty


def _sized_for_3_by_2(w, x, y):                # tuned to the docstring's example shape
    grads = torch.zeros(2, 3, 2, device=w.device)
    fit, penalty = _losses(w, x, y)
    grads[0] = torch.autograd.grad(fit, w, retain_graph=True)[0]
    grads[1] = torch.autograd.grad(penalty, w)[0]
    return grads[0], grads[1]


PER_LOSS_WRONG = {"the shipped code": _shipped, "retain_graph only": _retain_only,
                  "cloned, never zeroed": _clone_without_zeroing, "earlier gradient left in": _stale_grad_kept,
                  "one backward of the sum": _summed, "forward run twice": _two_forwards,
                  "sized for (3, 2)": _sized_for_3_by_2}


@pytest.mark.parametrize("name", PER_LOSS_WRONG)
def test_check_per_loss_gradients_rejects(name, learner):
    _first_verdict_is_an_observation(check_per_loss_gradients(PER_LOSS_WRONG[name]))


def _backward_twice_done_right(w, x, y):
    fit, penalty = _losses(w, x, y)
    w.grad = None
    fit.backward(retain_graph=True)
    grad_fit = w.grad
    w.grad = None                               # the next pass makes a new tensor; grad_fit keeps the old one
    penalty.backward()
    return grad_fit, w.grad


def _subtract(w, x, y):
    fit, penalty = _losses(w, x, y)
    if w.grad is not None:
        w.grad.zero_()
    fit.backward(retain_graph=True)
    grad_fit = w.grad.clone()
    penalty.backward()
    return grad_fit, w.grad - grad_fit


@pytest.mark.parametrize("answer", [reference("per_loss_gradients"), _backward_twice_done_right, _subtract])
def test_check_per_loss_gradients_accepts(answer, learner):
    assert check_per_loss_gradients(answer)


def test_check_per_loss_gradients_says_what_it_saw(learner):
    assert "Trying to backward through the graph a second time" in str(check_per_loss_gradients(_shipped))
    assert "it equals fit + penalty's gradient" in str(check_per_loss_gradients(_retain_only))
    assert "w.grad held an earlier gradient" in str(check_per_loss_gradients(_stale_grad_kept))
    assert "ran 2 times in one call" in str(check_per_loss_gradients(_two_forwards))
