"""From the evidence `course_utils.observe` wrote to findings: one function per family of bugs.

Each rule reads numbers the run produced (gradient arrivals, norms, modes, what a loss was fed) and
returns `Finding`s naming the culprit; none reads the script's text. Thresholds are chosen to stay
silent on correct training (gradient accumulation, frozen layers, schedulers, clipping, bfloat16
autocast, eval/train switching); where the literature gives one, it is cited beside it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

# Thresholds. AUTOTRAINER: Zhang, Zhai, Ma, Shen, ICSE 2021, github.com/shiningrain/AUTOTRAINER,
# AutoTrainer/utils/monitor.py and utils.py `default_param`. DeepDiagnosis: Wardat, Cruz, Le, Rajan,
# ICSE 2022, github.com/DeepDiagnosis/ICSE2022, callback/callbacks.py.
VANISHING_RATIO = 1e-3        # AUTOTRAINER beta_1: |g_first layer| / |g_last layer| below this ...
VANISHING_FIRST_NORM = 1e-4   # ... and AUTOTRAINER beta_2: |g_first layer| below this (medians over the steps)
EXPLODING_GROWTH = 1e3        # ours: the total gradient norm grows a thousandfold over its first steps.
                              # (AUTOTRAINER's ratio rule, first/last > 70, fires on unnormalised inputs)
DEAD_FRACTION = 0.7           # AUTOTRAINER gamma and DeepDiagnosis: 70 % of a ReLU layer dead
SATURATED_FRACTION = 0.5      # DeepDiagnosis: more than half of a sigmoid/tanh's inputs beyond +-5
UNDERFLOW_ZERO_FRACTION = 0.2  # ours: share of float16 gradient entries that are exactly zero


@dataclass
class Finding:
    """One problem: a stable `rule` id, the `chapter` (1-6) that teaches it, a one-sentence `message`
    naming the culprit, and the `evidence` (the numbers that triggered it)."""
    rule: str
    chapter: int
    message: str
    evidence: dict = field(default_factory=dict)

    def __str__(self) -> str:
        numbers = ", ".join(f"{k}={v}" for k, v in self.evidence.items())
        return f"[{self.rule}] (chapter {self.chapter}) {self.message}" + (f"\n    evidence: {numbers}" if numbers else "")


def _late(values: list) -> list:
    """The last third of a series (at least one point): the state training settled into."""
    return values[-max(1, len(values) // 3):]


def _trainable(e: dict) -> list[dict]:
    return [p for p in e["params"] if p["requires_grad"]]


def grad_not_cleared(e: dict) -> list[Finding]:
    carried = [p for p in _trainable(e) if p["carried_over"] >= max(2, 0.5 * (e["steps"] - 1))]
    if not carried:
        return []
    first = min(p["first_carry_step"] for p in carried)
    worst = max(carried, key=lambda p: p["carried_over"])
    return [Finding("grad-not-cleared", 1,
                    f"Gradients are never cleared: from step {first} on, each backward added onto the gradient the "
                    f"previous update had already used ({len(carried)} parameters, e.g. `{worst['name']}`); call "
                    "optimizer.zero_grad() once per step.",
                    {"steps": e["steps"], "steps_with_stale_gradient": worst["carried_over"],
                     "parameters": len(carried)})]


def step_without_gradient(e: dict) -> list[Finding]:
    empty, steps = len(e["no_grad_steps"]), e["steps"]
    if steps < 3 or not e["backwards"] or empty < 0.5 * steps:
        return []
    return [Finding("step-before-backward", 2,
                    f"optimizer.step() found no gradient in {empty} of {steps} steps although backward ran "
                    f"{e['backwards']} times: step() comes before loss.backward(), or zero_grad() sits between them.",
                    {"steps": steps, "steps_without_gradient": empty, "backwards": e["backwards"],
                     "cleared_after_backward": len(e["zeroed_before_step"])})]


def _by_module(params: list[dict]) -> dict[str, list[dict]]:
    modules: dict[str, list[dict]] = {}
    for p in params:
        modules.setdefault(p["name"].rsplit(".", 1)[0], []).append(p)
    return modules


def params_not_updated(e: dict) -> list[Finding]:
    """Parameters that received gradients and never changed: not in any optimizer, or no optimizer stepped."""
    stale = [p for p in _trainable(e) if p["grad_arrivals"] and not p["changed"] and not p["in_optimizer"]]
    if not stale:
        return []
    if not e["steps"]:
        if e["backwards"] < 3:
            return []
        return [Finding("optimizer-not-stepped", 2,
                        f"loss.backward() ran {e['backwards']} times but no optimizer ever stepped and no parameter "
                        f"that received a gradient changed ({len(stale)} of them, e.g. `{stale[0]['name']}`).",
                        {"backwards": e["backwards"], "optimizer_steps": 0, "parameters": len(stale)})]
    groups: dict[str, list[dict]] = {}
    for p in stale:            # one finding per plain container, else per module
        groups.setdefault(p["container"] or p["name"].rsplit(".", 1)[0], []).append(p)
    findings = []
    for where, params in groups.items():
        unregistered = params[0]["container"] is not None
        why = ("it is kept outside the model's registered submodules, so model.parameters() never saw it: use "
               "nn.ModuleList / nn.ModuleDict, or assign it as an attribute" if unregistered
               else "its parameters were never given to the optimizer")
        findings.append(Finding("param-not-in-optimizer", 2,
                                f"`{where}` took part in {params[0]['grad_arrivals']} backward passes but never "
                                f"changed ({len(params)} parameters, e.g. `{params[0]['name']}`): {why}.",
                                {"parameters": len(params), "gradients_received": params[0]["grad_arrivals"],
                                 "optimizer_steps": e["steps"], "registered": not unregistered}))
    return findings


def params_without_gradient(e: dict) -> list[Finding]:
    """Parameters in an optimizer whose module ran forward, yet no gradient ever reached them."""
    if e["steps"] < 3 or not any(p["grad_arrivals"] for p in e["params"]):
        return []
    cut = [p for p in _trainable(e) if p["in_optimizer"] and p["forward_seen"] and not p["grad_arrivals"]]
    return [Finding("param-no-gradient", 2,
                    f"`{module}` ran in the forward pass but no gradient reached it in {e['steps']} steps: its output "
                    "is cut off from the loss (detach(), .data, .item(), torch.no_grad(), or a result never used).",
                    {"parameters": len(params), "optimizer_steps": e["steps"], "gradients_received": 0})
            for module, params in _by_module(cut).items()]


def params_never_change(e: dict) -> list[Finding]:
    """In an optimizer, given non-zero gradients, and still identical at the end (a learning rate of 0...)."""
    frozen = [p for p in _trainable(e) if p["in_optimizer"] and p["nonzero_grad_steps"] >= 3 and not p["changed"]]
    if not frozen:
        return []
    return [Finding("param-never-changes", 2,
                    f"{len(frozen)} parameters (e.g. `{frozen[0]['name']}`) had non-zero gradients at "
                    f"{frozen[0]['nonzero_grad_steps']} optimizer steps and never changed: check the learning rate "
                    "and the parameter groups.", {"parameters": len(frozen), "steps": e["steps"]})]


def eval_mode_training(e: dict) -> list[Finding]:
    findings = []
    for root in e["roots"]:
        eval_steps, total = len(root["eval_steps"]), len(root["eval_steps"]) + root["train_steps"]
        # a frozen model kept in eval mode on purpose (a teacher, a frozen backbone) trains nothing
        if root["trains"] and root["mode_dependent"] and eval_steps >= 3 and eval_steps >= 0.5 * total:
            layers = ", ".join(f"`{m}`" for m in root["mode_dependent"][:3])
            findings.append(Finding("eval-mode-training", 2,
                                    f"`{root['name']}` was in eval mode during {eval_steps} of {total} training steps "
                                    f"(from step {root['eval_steps'][0]}): {layers} behaved as at test time while it "
                                    "trained; call model.train() after evaluating.",
                                    {"eval_steps": eval_steps, "steps": total, "first_eval_step": root["eval_steps"][0]}))
    return findings


def loss_inputs(e: dict) -> list[Finding]:
    """A loss fed the wrong form: probabilities to one that applies (log-)softmax/sigmoid itself, or
    logits/probabilities to NLLLoss, which wants log-probabilities."""
    findings = []
    for check in e["loss_checks"]:
        n, where = check["calls"], f"{check['function']} at {check['line']}"
        if n < 3:
            continue
        if check["function"] == "cross_entropy" and (check["softmax_grad_fn"] >= 0.5 * n or check["probabilities"] >= 0.9 * n):
            fed = (f"the output of a softmax in {check['softmax_grad_fn']} of {n} calls"
                   if check["softmax_grad_fn"] >= 0.5 * n else
                   f"probabilities (rows >= 0 summing to 1) in {check['probabilities']} of {n} calls")
            findings.append(Finding("double-softmax", 2,
                                    f"{where} was fed {fed}: cross_entropy applies log_softmax itself, so the "
                                    "softmax is applied twice; pass the raw logits.",
                                    {"calls": n, "probability_rows": check["probabilities"],
                                     "from_softmax": check["softmax_grad_fn"]}))
        elif check["function"] == "binary_cross_entropy_with_logits" and check["sigmoid_grad_fn"] >= 0.5 * n:
            findings.append(Finding("double-softmax", 2,
                                    f"{where} was fed values already in [0, 1] ({check['in_unit_interval']} of {n} calls, "
                                    f"{check['sigmoid_grad_fn']} straight from a sigmoid): it applies the sigmoid itself; "
                                    "pass the raw logits.",
                                    {"calls": n, "in_unit_interval": check["in_unit_interval"],
                                     "from_sigmoid": check["sigmoid_grad_fn"]}))
        elif check["function"] == "nll_loss" and check["log_probabilities"] < 0.5 * n:
            fed = "probabilities" if check["probabilities"] >= 0.5 * n else "raw scores"
            findings.append(Finding("loss-expects-log-probs", 2,
                                    f"{where} was fed {fed}, not log-probabilities (rows whose logsumexp is 0 in only "
                                    f"{check['log_probabilities']} of {n} calls): apply log_softmax first, or use "
                                    "cross_entropy on the logits.",
                                    {"calls": n, "log_probability_calls": check["log_probabilities"],
                                     "probability_calls": check["probabilities"]}))
    return findings


def loss_broadcast(e: dict) -> list[Finding]:
    return [Finding("loss-broadcast", 2,
                    f"{b['function']} at {b['line']} compared an input of shape {tuple(b['input'])} with a target of "
                    f"shape {tuple(b['target'])}: they broadcast to {tuple(b['result'])}, pairing every prediction with "
                    "every target; make the shapes equal (squeeze/unsqueeze).",
                    {"calls": b["calls"], "input": b["input"], "target": b["target"], "broadcast": b["result"]})
            for b in e["broadcasts"]]


def _total_norms(e: dict) -> tuple[list[int], list[float]]:
    steps, totals = [], []
    for step, norms in zip(e["grad_norms"]["steps"], e["grad_norms"]["values"]):
        known = [n for n in norms if n is not None]
        if known:
            steps.append(step)
            totals.append(math.sqrt(sum(n * n for n in known)) if all(map(math.isfinite, known)) else math.inf)
    return steps, totals


def exploding_gradients(e: dict) -> list[Finding]:
    steps, totals = _total_norms(e)
    if len(totals) < 5:
        return []
    opening = [t for t in totals[:max(3, len(totals) // 10)] if math.isfinite(t)]
    start = min(opening, default=0.0)        # the smallest of the first steps: a fast blow-up starts at step 2
    if not start > 0:
        return []
    # growth seen in finite norms only: a jump straight to inf/NaN is the non-finite rules' to explain
    onset = next((s for s, t in zip(steps, totals) if math.isfinite(t) and t >= EXPLODING_GROWTH * start), None)
    # and growth that lasts (the late median stays far up) or ends in inf/NaN, not one large batch
    after = [t for s, t in zip(steps, totals) if onset is not None and s >= onset]
    lasting = statistics.median(_late(totals)) >= EXPLODING_GROWTH / 10 * start or not all(map(math.isfinite, after))
    if onset is None or not lasting:
        return []
    peak = max(t for t in totals if math.isfinite(t))
    return [Finding("exploding-gradients", 3,
                    f"The gradient norm exploded: from {start:.3g} over the first steps to {peak:.3g} "
                    f"(x{EXPLODING_GROWTH:.0e} reached at step {onset}); lower the learning rate, clip gradients, or "
                    "fix the initialisation.",
                    {"first_norm": round(start, 6), "peak_norm": peak, "onset_step": onset})]


def vanishing_gradients(e: dict) -> list[Finding]:
    names, rows = e["grad_norms"]["names"], e["grad_norms"]["values"]
    if len(names) < 3 or len(rows) < 5:
        return []
    ratios = [row[0] / row[-1] for row in rows if len(row) >= len(names) and row[0] is not None and row[-1]
              and math.isfinite(row[0]) and math.isfinite(row[-1])]
    if len(ratios) < 5:
        return []
    ratio = statistics.median(ratios)
    first = statistics.median(row[0] for row in rows if row[0] is not None)
    if ratio >= VANISHING_RATIO or first >= VANISHING_FIRST_NORM:
        return []
    return [Finding("vanishing-gradients", 3,
                    f"Gradients vanish on their way back: `{names[0]}` gets {ratio:.1e} of the gradient norm of "
                    f"`{names[-1]}` (median over {len(ratios)} steps); use ReLU-family activations, a suited "
                    "initialisation (Kaiming/Xavier), normalisation or residual connections.",
                    {"first_to_last_ratio": float(f"{ratio:.3g}"), "first_layer_norm": float(f"{first:.3g}"),
                     "layers": len(names)})]


def activations(e: dict) -> list[Finding]:
    findings = []
    for site, entry in e["activations"].items():
        if len(entry["values"]) < 5:
            continue
        late = statistics.mean(_late(entry["values"]))
        if entry["kind"] == "relu" and late >= DEAD_FRACTION:
            findings.append(Finding("dead-relu", 3,
                                    f"{late:.0%} of the units after `{site}` never fire (output 0 for every sample of "
                                    "the batch) late in training: they get no gradient and cannot recover; lower the "
                                    "learning rate, check the biases' initialisation, or use LeakyReLU.",
                                    {"dead_fraction": round(late, 3), "observations": len(entry["values"])}))
        elif entry["kind"] in ("sigmoid", "tanh") and late > SATURATED_FRACTION:
            findings.append(Finding("saturated-activation", 3,
                                    f"{late:.0%} of the outputs of the {entry['kind']} at `{site}` sit in its flat ends "
                                    "late in training, where its gradient is ~0: normalise the inputs, shrink the "
                                    "initialisation, or use a ReLU-family activation.",
                                    {"saturated_fraction": round(late, 3), "observations": len(entry["values"])}))
    return findings


def nonfinite(e: dict) -> list[Finding]:
    """The first non-finite value: the earliest step, and within a step the chain data -> activations ->
    loss -> gradients (a NaN loss at step k makes NaN weights, then NaN activations at step k+1)."""
    chain = ("data", "activation", "loss", "gradient")
    events = sorted((event["step"], chain.index(kind), kind, event) for kind, event in e["nonfinite"].items())
    if not events:
        return []
    step, _, kind, ev = events[0]
    if kind == "data":
        return [Finding("nonfinite-input", 3, f"The data held NaN/inf before the model saw it ({ev['where']}, step "
                        f"{step}): clean or normalise it (a log of 0, a division by a zero std).", {"step": step})]
    if kind == "activation":
        return [Finding("nonfinite-activation", 3, f"`{ev['module']}` ({ev['type']}) was the first module to output "
                        f"NaN/inf from finite inputs, at step {step}.", {"step": step})]
    if kind == "loss":
        return [Finding("nonfinite-loss", 3, f"The loss became {ev['value']} at step {step} ({ev['line']}) while "
                        "every module's output was finite: the loss computation itself (a log of 0, a division) "
                        "produced it.", {"step": step})]
    return [Finding("nonfinite-gradient", 3, f"backward produced NaN/inf in the gradient of `{ev['param']}` at step "
                    f"{step} while the forward pass and the loss were finite.", {"step": step})]


def graphs_kept_alive(e: dict) -> list[Finding]:
    steps, nodes = e["graph_nodes"]["steps"], e["graph_nodes"]["values"]
    if len(nodes) < 4:
        return []
    growth = nodes[-1] - nodes[0]
    rising = sum(b > a for a, b in zip(nodes, nodes[1:])) >= 0.8 * (len(nodes) - 1)
    if not (rising and growth >= 100 and nodes[-1] >= 3 * max(nodes[0], 1)):
        return []
    return [Finding("graphs-kept-alive", 3,
                    f"Autograd graphs pile up: {nodes[0]} graph nodes were reachable from live tensors at step "
                    f"{steps[0]}, {nodes[-1]} at step {steps[-1]}: something keeps each step's loss or outputs (a "
                    "`total += loss`, a list of losses); keep loss.item() instead.",
                    {"nodes_first": nodes[0], "nodes_last": nodes[-1], "steps": [steps[0], steps[-1]]})]


def eval_builds_graph(e: dict) -> list[Finding]:
    unused = e["eval_graph_unused"]
    if unused < 2:
        return []
    return [Finding("eval-builds-graph", 2,
                    f"{unused} forward passes ran in eval mode with autograd recording, and no backward used their "
                    "graphs: evaluate under torch.no_grad() or torch.inference_mode().",
                    {"unused_graph_forwards": unused, "eval_forwards_with_grad": e["eval_graph_forwards"]})]


def data_order(e: dict) -> list[Finding]:
    labels = e["labels"]
    sequence = labels.get("sequence", [])
    # sorted data come in long runs of one class; a GAN's constant real/fake targets switch every call
    switches = sum(a != b for a, b in zip(sequence, sequence[1:]))
    if (labels["calls"] >= 5 and labels["classes"] >= 2 and labels["single_class"] >= 0.8 * labels["calls"]
            and switches <= 0.2 * len(sequence)):
        return [Finding("unshuffled-data", 2,
                        f"{labels['single_class']} of {labels['calls']} training batches held a single class out of "
                        f"{labels['classes']}: the data come sorted by label; shuffle them (shuffle=True, or the shuffle of the loader's sampler).",
                        {"single_class_batches": labels["single_class"], "batches": labels["calls"],
                         "classes": labels["classes"]})]
    for loader in e["loaders"]:
        if loader["steps"] and loader["epochs"] >= 2 and loader["sampler"] == "SequentialSampler":
            return [Finding("unshuffled-data", 2,
                            f"The training DataLoader used a SequentialSampler for {loader['epochs']} epochs: every "
                            "epoch saw the same batches in the same order; pass shuffle=True.",
                            {"epochs": loader["epochs"], "sampler": loader["sampler"]})]
    return []


def sampler_epochs(e: dict) -> list[Finding]:
    return [Finding("sampler-without-set-epoch", 5,
                    f"A DistributedSampler was iterated {len(s['epochs'])} times, always with epoch {s['epochs'][0]}: "
                    "every epoch shuffled the same way; call sampler.set_epoch(epoch) before each epoch.",
                    {"iterations": len(s["epochs"]), "epochs_seen": sorted(set(s["epochs"]))})
            for s in e["dist_samplers"] if s["shuffle"] and len(s["epochs"]) >= 2 and len(set(s["epochs"])) == 1]


def fp16_underflow(e: dict) -> list[Finding]:
    fp16 = e["fp16"]
    zeros = fp16["zero_fraction"]
    if fp16["scaler_used"] or len(zeros) < 3:
        return []
    typical = statistics.median(zeros)
    if typical < UNDERFLOW_ZERO_FRACTION:
        return []
    how = "autocast to float16" if fp16["autocast_fp16_forwards"] else "a float16 model"
    return [Finding("fp16-gradients-underflow", 6,
                    f"Training with {how} and no GradScaler: {typical:.0%} of the gradient entries are exactly 0 "
                    "(median over the steps), gradients too small for float16; use torch.amp.GradScaler or bfloat16.",
                    {"zero_fraction": round(typical, 3), "steps": len(zeros)})]


def compile_recompiles(e: dict) -> list[Finding]:
    stats, frames = e["dynamo"].get("stats", {}), e["dynamo"].get("frames", {})
    graphs = stats.get("unique_graphs", 0)
    if graphs < 5 or frames.get("total", 0) < 5:
        return []
    return [Finding("compile-recompiles", 6,
                    f"torch.compile compiled {frames['total']} times ({graphs} different graphs): each new input shape, "
                    "dtype or Python value it guards on compiles again; pad to fixed shapes, mark dimensions dynamic, "
                    "or pass tensors instead of changing Python numbers.", {"compilations": frames["total"],
                                                                             "graphs": graphs})]


def resume_without_optimizer(e: dict) -> list[Finding]:
    ck = e["checkpoints"]
    if ck["optimizer_loads"] or not ck["model_loads"] or not e["optimizer_state"]:
        return []
    for load in ck["loads"]:
        resumes = load["optimizer_state"] or any(k in ("epoch", "step", "iteration", "global_step") for k in load["keys"])
        if resumes and e["steps"] > load["step"]:
            had = ("the file holds the optimizer's state but it was never loaded" if load["optimizer_state"]
                   else "the file holds no optimizer state")
            return [Finding("resume-without-optimizer-state", 4,
                            f"Training resumed from a checkpoint (loaded at step {load['step']}) with a fresh optimizer: "
                            f"{had}, so momentum/Adam statistics restart from zero; save and load "
                            "optimizer.state_dict() too.", {"loaded_at_step": load["step"],
                                                            "file_has_optimizer_state": load["optimizer_state"]})]
    return []


RULES = (nonfinite, exploding_gradients, vanishing_gradients, grad_not_cleared, step_without_gradient,
         params_not_updated, params_without_gradient, params_never_change, eval_mode_training, loss_inputs,
         loss_broadcast, activations, graphs_kept_alive, eval_builds_graph, data_order, sampler_epochs,
         fp16_underflow, compile_recompiles, resume_without_optimizer)


def findings_from(evidence: dict) -> list[Finding]:
    """Every rule's findings, without those another finding explains: a gradient explosion explains the
    non-finite values that follow it; gradients never cleared (a growing sum) and label-sorted batches
    (each batch pulls another way) explain large gradient norms; an optimizer that steps without gradients,
    vanishing gradients and float16 underflow explain parameters that never change."""
    found = [f for rule in RULES for f in rule(evidence)]
    ids = {f.rule for f in found}
    if ids & {"grad-not-cleared", "unshuffled-data"}:
        found = [f for f in found if f.rule != "exploding-gradients"]
        ids.discard("exploding-gradients")
    if "exploding-gradients" in ids:
        onset = next(f.evidence["onset_step"] for f in found if f.rule == "exploding-gradients")
        found = [f for f in found if not (f.rule.startswith("nonfinite-") and f.evidence.get("step", 0) >= onset)]
    if ids & {"step-before-backward", "vanishing-gradients", "fp16-gradients-underflow"}:
        found = [f for f in found if f.rule != "param-never-changes"]     # updates too small or never made
    if "fp16-gradients-underflow" in ids:
        found = [f for f in found if f.rule != "vanishing-gradients"]     # float16 zeroed them, not depth
    return found
