"""The template index and the traceback frames that place an uncurated PyTorch error (course_utils.error_origin),
and the index's generator, tools/build_error_index.py, kept in step with the installed torch."""
import gzip
import json
import re
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from course_utils import explain
from course_utils import error_origin
from course_utils.error_origin import AREAS, HOLE, area_of, frames, match_template, origin, template_versions
from course_utils.explain import normalise

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_error_index  # noqa: E402

VERSION = torch.__version__.split("+")[0]


def stored_index() -> dict:
    path = build_error_index.index_path(VERSION)
    assert path.exists(), f"no template index for torch {VERSION}: run tools/build_error_index.py with this torch"
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return json.load(file)


@pytest.mark.slow
def test_python_templates_are_those_of_the_installed_torch():
    stored = {json.dumps(e, sort_keys=True) for e in stored_index()["templates"] if e["file"].endswith(".py")}
    fresh = {json.dumps(e, sort_keys=True)
             for e in build_error_index.python_templates(Path(torch.__file__).parent)}
    assert stored == fresh, (f"{len(fresh - stored)} templates new in torch {torch.__version__}, "
                             f"{len(stored - fresh)} gone: rerun tools/build_error_index.py")


@pytest.mark.slow
def test_cpp_templates_are_strings_of_the_installed_libraries():
    index = build_error_index.library_index(Path(torch.__file__).parent)
    cpp = [e for e in stored_index()["templates"] if not e["file"].endswith(".py")]
    assert len(cpp) > 500
    missing = [e["t"] for e in cpp if not build_error_index.in_library(e, index)]
    assert not missing, f"{len(missing)} C++ templates not in this torch's libraries, e.g. {missing[:3]}"
    assert not build_error_index.in_library({"t": f"No such message {HOLE} was ever written by PyTorch"}, index)
    assert not build_error_index.in_library({"t": "x", "pieces": ["No such message", "was ever written"]}, index)


def test_the_generator_reads_python_and_cpp_messages(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f(x, n):\n"
                      "    msg = f'expected {n} channels'\n"
                      "    msg += ', got %d' % x\n"
                      "    if x:\n        raise ValueError(msg)\n"
                      "    raise RuntimeError('Found {} devices and {} ranks'.format(x, n))\n")
    visitor = build_error_index._PythonRaises()
    import ast
    visitor.visit(ast.parse(source.read_text()))
    assert (f"expected {HOLE} channels, got {HOLE}", "f", "ValueError") in visitor.found   # f-string, then += %
    assert (f"Found {HOLE} devices and {HOLE} ranks", "f", "RuntimeError") in visitor.found
    cpp = tmp_path / "Conv.cpp"
    cpp.write_text('TORCH_CHECK(input.dim() == 4, "Expected 4D input, but got input of size: ", input.sizes(),\n'
                   '            " instead");  // a comment, "not a message"\n'
                   'TORCH_CHECK_WITH(DistBackendError, ok, fmt::format("rank {} failed after {} ms", r, t));\n')
    found = {e["t"] for e in build_error_index.cpp_templates(cpp, "ATen/native/Conv.cpp")}
    assert found == {f"Expected 4D input, but got input of size: {HOLE} instead", f"rank {HOLE} failed after {HOLE} ms"}


def test_the_generator_steps_over_cpp_literals_whose_characters_look_like_code(tmp_path):
    cpp = tmp_path / "Ops.cpp"
    cpp.write_text("TORCH_CHECK(c != ')', \"Could not run '\", op, \"' with arguments from the '\", key,\n"
                   "            \"' backend (\\\"\", x, \"\\\")\");\n"
                   'TORCH_CHECK(ok, R"-(a raw message with a "quote" and ) inside)-", n, ", or (");\n')
    found = {e["t"] for e in build_error_index.cpp_templates(cpp, "ATen/core/Ops.cpp")}
    assert found == {f"Could not run '{HOLE}' with arguments from the '{HOLE}' backend (\"{HOLE}\")",
                     f'a raw message with a "quote" and ) inside{HOLE}, or ('}


def test_the_generator_reads_cpp_messages_built_before_they_are_raised(tmp_path):
    cpp = tmp_path / "engine.cpp"
    cpp.write_text('void a() {\n'
                   '  std::stringstream ss;\n'
                   '  ss << "invalid gradient at index " << i << " - got ";\n'
                   '  if (nested) { ss << "a nested tensor of sizes"; } else { ss << grad.sizes(); }\n'
                   '  ss << " but expected shape compatible with " << \'{\' << shape << \'}\';\n'
                   '  TORCH_CHECK(false, ss.str());\n'
                   '  std::string msg = c10::str("the derivative for \'", name, "\' is not implemented.");\n'
                   '}\n'
                   'void b() {\n'
                   '  std::ostringstream oss; oss << "Exception raised from " << where << ": " << what;\n'
                   '  throw Error(oss.str());\n'                              # the error machinery's framing
                   '  std::stringstream ss; ss << "a stream only printed, never raised"; std::cout << ss.rdbuf();\n'
                   '  std::string repr = c10::str("Tensor(shape=", sizes, ", dtype=", dtype, ")");\n'   # not a message
                   '}\n')
    found = {e["t"] for e in build_error_index.cpp_templates(cpp, "torch/csrc/autograd/engine.cpp")}
    # (what only one branch streams is a hole: "a nested tensor of sizes" is not always in the message)
    assert found == {f"invalid gradient at index {HOLE} - got {HOLE} but expected shape compatible with {HOLE}",
                     f"the derivative for '{HOLE}' is not implemented."}


def test_pythons_own_messages_that_torchscript_repeats_are_left_out():
    python_text = build_error_index.python_strings()
    assert build_error_index.pythons_own({"t": f"could not convert string to float: '{HOLE}'"}, python_text)
    assert build_error_index.pythons_own({"t": f"invalid literal for int() with base 10: '{HOLE}'"}, python_text)
    assert not build_error_index.pythons_own({"t": f"Expected all tensors to be on the same device, but {HOLE}"},
                                             python_text)
    assert not any(e["t"].startswith("could not convert string to float") for e in stored_index()["templates"])


def test_a_source_tree_gives_the_messages_of_its_cpp_files_but_not_of_its_tests(tmp_path):
    tree = tmp_path / "pytorch-v2.6.0"
    (tree / "aten/src/ATen/native/mps").mkdir(parents=True)
    (tree / "aten/src/ATen/test").mkdir(parents=True)
    (tree / "third_party/fmt").mkdir(parents=True)
    (tree / "aten/src/ATen/native/mps/Alloc.mm").write_text('TORCH_CHECK(ok, "Invalid buffer size: ", size);\n')
    (tree / "aten/src/ATen/test/basic.cpp").write_text('TORCH_CHECK(ok, "a test of the check macro itself");\n')
    (tree / "third_party/fmt/format.cc").write_text('throw std::runtime_error("a vendored library says this");\n')
    assert [p.relative_to(tree).as_posix() for p in build_error_index.tree_files(tree)] == \
        ["aten/src/ATen/native/mps/Alloc.mm"]
    templates, _ = build_error_index.header_and_source_templates(tmp_path / "no-wheel", None, tree)
    assert {(e["t"], e["file"]) for e in templates} == {(f"Invalid buffer size: {HOLE}", "ATen/native/mps/Alloc.mm")}


def test_the_index_says_which_torch_it_came_from():
    assert VERSION in template_versions() and set(template_versions()) <= {"2.13.0", "2.14.1", *RETIRED}
    index = stored_index()
    assert index["torch"] == VERSION and "pytorch/pytorch files (path: commit)" in index["cpp_source"]
    assert "PyTorch 2.6.0 release tree" in index["cpp_source"]["source tree"]


# older releases' wordings (tools/build_error_index.py --release): a 1.x message still fills the forums
RETIRED = {"1.4.0", "1.8.1", "1.11.0", "1.13.1"}


def test_an_older_release_gives_only_the_wordings_no_newer_index_holds(tmp_path, monkeypatch):
    tree = tmp_path / "pytorch-1.0.0"
    (tree / "torch/optim").mkdir(parents=True)
    (tree / "aten/src/ATen/native").mkdir(parents=True)
    (tree / "torch/optim/optimizer.py").write_text(
        "def add_param_group(param):\n"
        "    if not param.requires_grad:\n        raise ValueError(\"optimizing a parameter that doesn't require gradients\")\n"
        "    raise TypeError('optimizer can only optimize Tensors, but one of the params is ' + type(param))\n")
    (tree / "aten/src/ATen/native/Old.cpp").write_text('void f(int n) { TORCH_CHECK(n > 0, "an old check no library holds: ", n); }\n')
    monkeypatch.setattr(build_error_index, "DATA", tmp_path)
    for version, held in (("2.0.0", f"optimizer can only optimize Tensors, but one of the params is {HOLE}"),
                          ("0.4.0", "optimizing a parameter that doesn't require gradients")):    # newer, older
        with gzip.open(build_error_index.index_path(version), "wt", encoding="utf-8") as file:
            json.dump({"torch": version, "templates": [{"t": held, "file": "torch/optim/optimizer.py"}]}, file)
    index = build_error_index.release_index(tree, "1.0.0", "a test tree")
    assert index["torch"] == "1.0.0" and index["retired"] and "a test tree" in index["python_source"]
    assert {(e["t"], e["file"]) for e in index["templates"]} == {
        ("optimizing a parameter that doesn't require gradients", "torch/optim/optimizer.py"),   # the older holds it too
        (f"an old check no library holds: {HOLE}", "ATen/native/Old.cpp")}                       # its own tree: kept


def test_the_older_releases_indexes_hold_only_what_newer_ones_do_not():
    stored = {}
    for path in build_error_index.DATA.glob("error_templates-*.json.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as file:
            stored[path] = json.load(file)
    assert {index["torch"] for index in stored.values() if index.get("retired")} == RETIRED
    for index in stored.values():
        if index.get("retired"):
            newer = {e["t"] for other in stored.values() for e in other["templates"]
                     if build_error_index._version(other["torch"]) > build_error_index._version(index["torch"])}
            assert not newer & {e["t"] for e in index["templates"]}, index["torch"]
            assert re.search(r"sha256 [0-9a-f]{64}", index["python_source"]), index["torch"]


def test_a_wording_only_an_older_release_raised_is_placed_where_it_was_raised():
    # torch 1.11's nn.ParameterList.__setattr__; 2.x no longer has it
    found = origin(normalise("Setting attributes on ParameterList is not supported"))
    assert (found.file, found.found_by, found.area.id) == ("torch/nn/modules/container.py", "template", "module")
    floordiv = ("/src/lanczos.py:39: UserWarning: __floordiv__ is deprecated, and its behavior will change in a future "
                "version of pytorch. It currently rounds toward 0 (like the 'trunc' function NOT 'floor'). This "
                "results in incorrect rounding for negative values. To keep the current behavior, use "
                "torch.div(a, b, rounding_mode='trunc')")
    assert match_template(normalise(floordiv)).file == "torch/_tensor.py"


def test_the_indexes_are_listed_in_version_order_a_pre_release_too(tmp_path, monkeypatch):
    for version in ("2.15.0a0", "1.4.0", "2.13.0"):
        with gzip.open(tmp_path / f"error_templates-{version}.json.gz", "wt", encoding="utf-8") as file:
            json.dump({"torch": version, "templates": []}, file)
    monkeypatch.setattr(error_origin, "DATA", tmp_path)
    error_origin._index.cache_clear()
    try:
        assert template_versions() == ("1.4.0", "2.13.0", "2.15.0a0")
    finally:
        monkeypatch.undo()
        error_origin._index.cache_clear()


def test_a_pinned_releases_template_wins_over_a_longer_retired_one(monkeypatch):
    pinned = error_origin._Template(f"Expected {HOLE} to be on the same device", "ATen/native/TensorIterator.cpp",
                                    "", 30)
    retired = error_origin._Template(f"Expected {HOLE} to be on the same device, in the old words", "TH/THTensor.cpp",
                                     "", 46, retired=True)
    monkeypatch.setattr(error_origin, "_index", lambda: ({"device": [retired, pinned]}, ("1.4.0", "2.13.0")))
    text = "RuntimeError: Expected x to be on the same device, in the old words"
    assert match_template(text) is pinned
    monkeypatch.setattr(error_origin, "_index", lambda: ({"device": [retired]}, ("1.4.0",)))
    assert match_template(text) is retired


def test_a_template_matches_with_new_values_in_its_holes():
    # Convolution.cpp: TORCH_CHECK(..., "Given groups=", groups, ", weight of size ", ..., " channels instead")
    text = "ValueError: Given groups=1, weight of size [64, 3, 7, 7], expected input[1, 1, 224, 224] to have 3 " \
           "channels, but got 1 channels instead"
    found = match_template(text)
    assert found is not None and found.file == "ATen/native/Convolution.cpp"
    other = text.replace("64, 3, 7, 7", "8, 12, 3, 3").replace("3 channels", "12 channels")
    assert match_template(other).text == found.text


def test_an_older_wording_that_ends_differently_still_matches_its_start():
    # the 2.x template ends with "error=...)" which this 1.x message lacks
    old = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 3, for key: "
           "store_based_barrier_key:1 (world_size=4, worker_count=3, timeout=0:30:00)")
    found = match_template(normalise(old))
    assert found is not None and found.file == "torch/distributed/distributed_c10d.py"


def test_an_older_release_whose_message_is_the_first_sentences_of_todays_matches():
    # VariableTypeManual.cpp's message has since gained advice about DDP after these two sentences (1.x's whole
    # message); a start of it that ends mid-sentence is not enough
    found = match_template(normalise("RuntimeError: Can't detach views in-place. Use detach() instead"))
    assert found is not None and found.file == "torch/csrc/autograd/VariableTypeManual.cpp"
    assert match_template(normalise("RuntimeError: Can't detach views in-place. Use det")) is None


def test_frames_of_a_pasted_traceback():
    pasted = normalise(
        'Traceback (most recent call last):\n'
        '  File "train.py", line 12, in <module>\n'
        '  File "C:\\Users\\me\\envs\\t\\Lib\\site-packages\\torch\\nn\\modules\\module.py", line 1553, in _call_impl\n'
        '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/c10d_logger.py", line 79, in wrapper\n'
        'RuntimeError: something\n'
        'Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:670 (most recent call first):')
    assert frames(pasted) == [(None, "<module>"), ("torch/nn/modules/module.py", "_call_impl"),
                              ("torch/distributed/c10d_logger.py", "wrapper"),
                              ("torch/csrc/distributed/c10d/Utils.hpp", "recvBytes")]
    assert origin(pasted).area.id == "distributed" and origin(pasted).found_by == "traceback"


def test_frames_in_jupyter_and_rich_tracebacks():
    jupyter = normalise("File ~/miniconda3/lib/python3.11/site-packages/torch/serialization.py:1495, in load(f)\n"
                        "UnpicklingError: something")
    rich = normalise("│ /usr/local/lib/python3.10/dist-packages/torch/optim/lr_scheduler.py:152 in step │")
    assert frames(jupyter) == [("torch/serialization.py", "load")]
    assert frames(rich) == [("torch/optim/lr_scheduler.py", "step")]


def test_an_error_raised_in_the_users_code_is_not_placed_by_the_torch_frames_that_called_it():
    pasted = normalise(
        '  File "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", line 1553, in _call_impl\n'
        '  File "/home/me/model.py", line 40, in forward\n'
        'KeyError: "backbone"')
    assert origin(pasted) is None and explain(pasted) is None


def test_every_area_points_at_a_real_section_and_a_docs_page():
    from tests.test_explain import notebook_headings
    for _, area in AREAS + error_origin.TOPICS:
        if area.chapter is not None:
            assert area.section in notebook_headings(area.chapter), (area.id, area.section)
        assert re.fullmatch(r"https://docs\.pytorch\.org/docs/stable/\S+", area.docs), area.docs
    assert area_of("torch/nn/modules/module.py", "Module.load_state_dict").chapter == 4
    assert area_of("torch/nn/modules/module.py", "Module.__setattr__").chapter == 2
    assert area_of("torch/utils/data/distributed.py").chapter == 5
    assert area_of("torch/utils/cpp_extension.py") is None        # no chapter teaches building extensions


def raised(fn):
    try:
        fn()
    except Exception as error:
        return error
    raise AssertionError("expected an error")


def test_an_uncurated_pytorch_error_is_placed_and_says_there_is_no_curated_fix():
    # interpolate's own ValueError: no rule knows it; its template lives in torch/nn/functional.py
    error = raised(lambda: nn.functional.interpolate(torch.ones(1, 2, 3), size=(2, 2)))
    got = explain(error)
    assert got is not None and got.id == "area-layers" and got.chapter == 2 and got.confidence == "low"
    assert not got.causes and "torch/nn/functional.py, in interpolate" in got.origin
    text = str(got)
    assert "No curated fix" in text and "Low confidence" in text and got.docs in text and got.link in text
    assert "No curated fix" in got._repr_html_()


def test_a_confident_placement_from_the_distributed_package():
    error = raised(lambda: torch.distributed.Backend(3))        # distributed_c10d.py: Backend.__new__
    got = explain(error)
    assert got is not None and got.chapter == 5 and got.confidence == "placed", (error, got)
    assert "Low confidence" not in str(got)


def test_errors_that_are_not_pytorchs_stay_unexplained():
    for message in ["KeyError: 'learning_rate'", "ModuleNotFoundError: No module named 'cv2'",
                    "ValueError: could not convert string to float: 'abc'",
                    "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor",
                    "error: subprocess-exited-with-error"]:
        assert explain(message) is None, message


def test_explain_stays_fast_on_real_messages():
    corpus = ROOT / "tests" / "data" / "error_messages.jsonl"
    messages = [json.loads(line)["message"] for line in corpus.read_text().splitlines() if line.strip()]
    explain(messages[0])                                    # the index loads once, on first use
    times = []
    for message in messages:
        started = time.perf_counter()
        explain(message)
        times.append(time.perf_counter() - started)
    assert statistics.median(times) < 0.010, f"median {statistics.median(times) * 1e3:.1f} ms per message"


def test_the_errors_own_words_replace_a_broad_placement():
    from course_utils.error_origin import topic_of
    assert topic_of(normalise('  File "model.py", line 3, in f\n    x = x.half()\nRuntimeError: bad input')) is None
    assert topic_of("RuntimeError: weight is on cuda:0 but the input is on cpu").id == "devices"
    assert topic_of("RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::Half").id == "amp"
    # a PyTorch RuntimeError no template or rule knows, about devices: placed, low confidence, and says why
    got = explain("RuntimeError: buffers of the head live on cuda:1 while the batch stays on cpu")
    assert got.id == "area-devices" and got.chapter == 3 and got.confidence == "low"
    assert "its words are about devices" in got.origin


def test_the_vocabulary_of_an_area_places_an_unknown_pytorch_message():
    from course_utils.error_origin import vocabulary_area
    message = "RuntimeError: the broadcast on this rank timed out waiting for peers"    # no rule, template, topic
    area, posterior = vocabulary_area(message)
    assert area.chapter == 5 and 0.7 <= posterior <= 1 and not area.confident
    got = explain(message)
    assert got.chapter == 5 and got.confidence == "low" and "probability" in got.origin
    assert vocabulary_area("RuntimeError: 42") is None                       # too few words to say anything
    # the same words from another framework are not PyTorch's
    assert explain("tensorflow.python.framework.errors_impl.InternalError: the broadcast on this rank timed "
                   "out waiting for peers") is None


def test_a_message_from_a_part_no_chapter_teaches_is_left_unplaced():
    # torch/utils/cpp_extension.py: building C++/CUDA extensions is not in the course
    assert explain("OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.") is None


def test_a_library_string_is_placed_in_the_file_that_precedes_it(tmp_path):
    package = tmp_path / "torch"
    (package / "lib").mkdir(parents=True)
    (package / "lib" / "libtorch_fake.so").write_bytes(
        b"\x00\x01/__w/pytorch/pytorch/torch/csrc/distributed/c10d/reducer.cpp\x00"
        b"Expected to have finished reduction in the prior iteration\x00\x02short\x00"
        b"/__w/pytorch/pytorch/third_party/miniz-3.0.2/miniz.c\x00failed finding central directory\x00"
        + b"\x00" * (build_error_index.LAYOUT_REACH + 10) + b"too far from any file to be placed, it is invalid\x00")
    found = {e["t"]: e["file"] for e in build_error_index.layout_templates(package)}
    assert found == {"Expected to have finished reduction in the prior iteration": "torch/csrc/distributed/c10d/reducer.cpp",
                     "failed finding central directory": "third_party/miniz-3.0.2/miniz.c"}


def one_dimensional_nll_loss():
    # a check of LossNLL.cpp newer than the 2.6.0 sources the index reads: this wheel's message is a string of
    # the library, placed by the layout
    return raised(lambda: torch.nn.functional.nll_loss(torch.ones(3).log_softmax(0), torch.tensor([0, 1])))


def test_a_cpp_message_without_source_is_placed_by_the_library_layout():
    got = explain(one_dimensional_nll_loss())
    assert "LossNLL.cpp (the file is inferred from the library's layout)" in got.origin
    assert got.chapter == 3 and got.confidence == "low", got      # the class-label losses' file: chapter 3


def test_a_long_library_string_is_pytorchs_without_a_pytorch_word():
    # the bare message, as pasted without its "RuntimeError:" label: 40+ characters of PyTorch's own string
    message = str(one_dimensional_nll_loss())
    assert not error_origin.looks_like_pytorch(message)
    found = origin(message)
    assert found is not None and found.found_by == "library" and found.area.chapter == 3
    # a short one is not enough: Python's own words, repeated by TorchScript
    assert origin("could not convert string to float: 'abc'") is None


def test_a_library_string_inferred_into_a_header_is_unplaced(monkeypatch):
    # a header's __FILE__ is inlined into every library that includes it, so the layout says nothing there
    header = error_origin._Template("Watchdog caught collective operation timeout:", "c10/core/TensorOptions.h", "",
                                    45, True)
    monkeypatch.setattr(error_origin, "match_template", lambda text, frames=(), inferred=True: header)
    found = origin("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)")
    assert found is not None and found.area is None
    # explain() then reads the error's own words: NCCL is chapter 5's
    got = explain("[BUG] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran "
                  "for 600013 milliseconds")
    assert got is not None and got.chapter == 5


def test_a_log_record_names_the_module_that_wrote_it():
    python_logging = "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0"
    glog = "E0323 21:57:08.583000 23 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)"
    for message in (python_logging, glog):
        assert error_origin.log_source(message) == "torch/distributed/elastic/multiprocessing/api.py"
        found = origin(normalise(message + '\nTraceback (most recent call last):\n  File "/opt/venv/bin/torchrun", '
                                           'line 10, in <module>'))
        assert found.found_by == "log" and found.area.chapter == 5 and "it was logged by" in found.describe()
    assert error_origin.log_source("INFO:root:epoch 3 done") is None


def test_a_cpp_file_named_by_its_base_name_is_found_among_pytorchs():
    assert frames("[E ProcessGroupNCCL.cpp:737] [Rank 1] timeout") == [
        ("torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp", "")]
    assert frames("[enforce fail at inline_container.cc:145] . PytorchStreamReader failed reading file data/3") == [
        ("caffe2/serialize/inline_container.cc", "")]
    assert frames("error at my_engine.cpp:12") == []                  # not one of PyTorch's files
    # a name an older release also used elsewhere (1.x's TensorUtils.cpp) is still today's file
    assert frames("[W TensorUtils.cpp:100] Warning: x") == [("ATen/TensorUtils.cpp", "")]


def test_the_errors_own_words_name_kernel_assertions_numpy_and_compilers():
    from course_utils.error_origin import topic_of
    kernel = ("/pytorch/aten/src/THCUNN/ClassNLLCriterion.cu:108: cunn_ClassNLLCriterion_updateOutput_kernel: "
              "block: [0,0,0], thread: [31,0,0] Assertion `t >= 0 && t < n_classes` failed.")
    assert topic_of(kernel).chapter == 3 and topic_of(kernel).id == "indexing"
    # the advice under every CUDA error names device-side assertions; it is not one
    assert topic_of("RuntimeError: CUDA error: invalid device ordinal. Compile with `TORCH_USE_CUDA_DSA` to enable "
                    "device-side assertions.").id == "cuda"
    assert topic_of("TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()").id == "numpy"
    assert topic_of("RuntimeError: Tensor for argument #2 'mat1' is on CPU, but expected it to be on GPU").id == \
        "devices"
    # the exception's class name is part of what it says
    assert topic_of("InductorError: CppCompileError: C++ compile error").id == "compile"


# Errors no curated rule covers, raised for real, and the chapter that teaches them (HELDOUT_RUBRIC.md's table)
def nan_parameter_of_a_distribution():
    # validate_args said explicitly: the first torch.compile in a process turns the default off for good
    # (torch/_dynamo/eval_frame.py, TorchPatcher.patch: Distribution.set_default_validate_args(False))
    torch.distributions.Normal(torch.tensor([float("nan")]), torch.tensor([1.0]), validate_args=True)


def one_hot_label_out_of_range():
    nn.functional.one_hot(torch.tensor([3]), num_classes=2)


def index_out_of_bounds():
    torch.zeros(1)[1]


def index_put_of_another_integer_dtype():
    destination = torch.zeros(3, dtype=torch.long)
    destination[torch.tensor([0])] = torch.tensor([1], dtype=torch.int32)


def loss_target_of_the_wrong_shape():
    nn.functional.nll_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4, dtype=torch.long))


def layer_built_with_a_float_size():
    nn.Linear(2.5, 3)


def torchscript_of_a_missing_method():
    def f(x):
        return x.nonexistent_method()
    torch.jit.script(f)


def einsum_of_unequal_sizes():
    torch.einsum("ij,jk->ik", torch.ones(2, 3), torch.ones(4, 5))


def cholesky_of_a_matrix_that_is_not_positive_definite():
    torch.linalg.cholesky(-torch.eye(2))


PLACED = [(nan_parameter_of_a_distribution, 3, "distributions"), (one_hot_label_out_of_range, 3, "indexing"),
          (einsum_of_unequal_sizes, 1, "tensor-ops"),
          (cholesky_of_a_matrix_that_is_not_positive_definite, 3, "numerics"),
          (index_out_of_bounds, 3, "indexing"), (index_put_of_another_integer_dtype, 1, "dtypes"),
          (loss_target_of_the_wrong_shape, 2, "loss"), (layer_built_with_a_float_size, 2, "module"),
          (torchscript_of_a_missing_method, 6, "torchscript")]


@pytest.mark.parametrize("make_error, chapter, area", PLACED, ids=[p[0].__name__ for p in PLACED])
def test_real_errors_without_a_rule_are_placed_in_the_chapter_that_teaches_them(make_error, chapter, area):
    error = raised(make_error)
    got = explain(error)
    assert got is not None and (got.id, got.chapter) == (f"area-{area}", chapter), f"{error!r} -> {got and got.id}"
    assert got.confidence == "low" and not got.causes                  # placed, not curated: it says so


def test_an_invalid_gradient_is_placed_by_the_message_autograd_builds_for_it():
    class HalfTheGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad[:1]                                  # one row where the input had three

    error = raised(lambda: HalfTheGradient.apply(torch.ones(3, 2, requires_grad=True)).sum().backward())
    assert "returned an invalid gradient at index 0" in str(error)
    got = explain(error)
    assert (got.id, got.chapter) == ("area-autograd", 1)
    assert got.origin == "its message matches a message written in torch/csrc/autograd/input_metadata.cpp"


def test_a_layer_built_wrong_is_placed_by_its_init_frame_not_by_the_tensor_op_that_failed():
    error = raised(layer_built_with_a_float_size)
    assert explain(error).chapter == 2                                 # the traceback's Linear.__init__
    assert explain(str(error)).chapter == 1                            # the message alone: only torch.empty's words


def test_the_standard_librarys_frames_are_not_where_an_error_was_made():
    pasted = normalise(
        '  File "C:\\Users\\me\\envs\\t\\lib\\site-packages\\torch\\utils\\data\\dataloader.py", line 914, in __init__\n'
        '  File "C:\\Users\\me\\envs\\t\\lib\\multiprocessing\\process.py", line 121, in start\n'
        '  File "/usr/lib/python3.10/pickle.py", line 578, in dump\n'
        "AttributeError: Can't pickle the worker's seed function")
    assert frames(pasted) == [("torch/utils/data/dataloader.py", "__init__")]
    assert explain(pasted).chapter == 2


def test_a_printed_tensor_is_not_read_as_words():
    from course_utils.error_origin import error_text
    assert "grad_fn" not in error_text("ValueError: bad values:\ntensor([0.5, nan], grad_fn=<SoftmaxBackward0>)")
    assert error_text("RuntimeError: x is tensor([[1, 2]], device='cuda:0') here").split() == \
        ["RuntimeError:", "x", "is", "here"]


def test_no_gpu_as_projects_and_wrappers_say_it():
    for message in ["CUDA is not available.", "There are not available cuda devices!",
                    "MisconfigurationException: GPUAccelerator can not run on your system since the accelerator is "
                    "not available.", "ValueError: fp16 mixed precision requires a GPU"]:
        got = explain(message)
        assert got is not None and got.chapter == 1 and got.confidence == "low", message
    assert explain("OSError: CUDA_HOME environment variable is not set.") is None
    assert explain("cupy.cuda.runtime.CUDARuntimeError: cudaErrorNoDevice: no CUDA-capable device is detected") is None


def test_the_cuda_librarys_own_words_are_pytorchs_only_in_pytorchs_framing():
    # cudaGetErrorString's words, printed by other programs (tuning-11: a physics engine, nccl-tests, darknet):
    # no chapter; the same words in PyTorch's "CUDA error: ..." or 1.x's "cuda runtime error (N)" are chapter 1's
    for message in ["CUDA Error CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected while calling init (cuInit)",
                    "458398: Test CUDA failure common.cu:730 'no CUDA-capable device is detected'",
                    "CUDA status Error: file: ./src/dark_cuda.c : () : line: 36 CUDA Error: invalid device ordinal",
                    # Lua Torch, PyTorch's predecessor: its paths say "torch" too
                    "/home/u/torch/install/bin/luajit: /home/u/torch/install/share/lua/5.1/trepl/init.lua:383: "
                    "cuda runtime error (35) : CUDA driver version is insufficient for CUDA runtime version"]:
        assert explain(message) is None, message
    assert explain("RuntimeError: CUDA error: invalid device ordinal").id == "invalid-device-ordinal"
    assert explain("RuntimeError: CUDA error: device-side assert triggered").id == "device-side-assert"
    old = explain("RuntimeError: cuda runtime error (100) : no CUDA-capable device is detected at "
                  "/pytorch/aten/src/THC/THCGeneral.cpp:47")
    assert old is not None and old.chapter == 1


def test_rocm_messages_read_as_the_cuda_messages_they_were_hipified_from():
    assert explain("RuntimeError: HIP error: invalid device ordinal").id == "invalid-device-ordinal"
    assert explain("RuntimeError: HIP error: invalid device function\nHIP kernel errors might be asynchronously "
                   "reported at some other API call").id == "cuda-driver"          # built for another gfx target
    assert explain("RuntimeError: CUDA error: invalid device function").id == "cuda-driver"
    kernel = explain("/pytorch/aten/src/ATen/native/hip/IndexKernel.hip:94: operator(): Device-side assertion "
                     "`-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"' failed.")
    assert kernel is not None and kernel.chapter == 3


def assert_placed_at_low_confidence(cases: dict[str, int]) -> None:
    """Each message gets its chapter, marked low-confidence (a placement, not a curated rule)."""
    for message, chapter in cases.items():
        got = explain(message)
        assert got is not None and got.chapter == chapter and got.confidence == "low", message


def test_other_accelerators_are_placed_like_cuda():
    # PyTorch's own backends for Intel GPUs (torch/xpu), TPUs (torch_xla) and Ascend NPUs (torch_npu): picking the
    # device is chapter 1, a CPU tensor given to an XLA op and a buffer too large are chapter 3
    cases = {'  File "/venv/lib/python3.12/site-packages/torch/xpu/__init__.py", line 120, in _lazy_init\n'
             '    torch._C._xpu_init()\nRuntimeError: No XPU devices are available.': 1,
             '  File "/usr/local/lib/python3.10/site-packages/torch_npu/npu/utils.py", line 80, in set_device\n'
             '    torch_npu._C._npu_setDevice(device_id)\nRuntimeError: Initialize:torch_npu/csrc/core/npu/'
             'sys_ctrl/npu_sys_ctrl.cpp:146 NPU function error: c10_npu::SetDevice(device_id_), error code is 507033': 1,
             "RuntimeError: /pytorch/xla/torch_xla/csrc/aten_xla_bridge.cpp:276 : Check failed: device.type() == "
             "at::kXLA (cpu vs. xla)": 3,
             "MPSNDArray.mm:794: failed assertion `[MPSNDArray, initWithBuffer:descriptor:] Error: buffer is not large "
             "enough. Must be 207456 bytes": 3}
    assert_placed_at_low_confidence(cases)


def test_a_process_started_with_spawn_that_fails_to_start_is_a_dataloader_workers_at_low_confidence():
    # Windows: only Python's frames, the parent pickling the process object or the child unpickling it
    parent = ('  File "C:\\envs\\lib\\multiprocessing\\popen_spawn_win32.py", line 89, in __init__\n'
              '    reduction.dump(process_obj, to_child)\n'
              '  File "C:\\envs\\lib\\multiprocessing\\reduction.py", line 60, in dump\n'
              '    ForkingPickler(file, protocol).dump(obj)\nBrokenPipeError: [Errno 32] Broken pipe')
    child = ('  File "<string>", line 1, in <module>\n'
             '  File "C:\\envs\\lib\\multiprocessing\\spawn.py", line 116, in spawn_main\n'
             '    exitcode = _main(fd, parent_sentinel)\n'
             '  File "C:\\envs\\lib\\multiprocessing\\spawn.py", line 126, in _main\n'
             '    self = reduction.pickle.load(from_parent)\n_pickle.UnpicklingError: pickle data was truncated')
    for message in (parent, child):
        got = explain(message)
        assert got is not None and got.chapter == 2 and got.confidence == "low", message
        assert "spawn" in got.origin
    # a multiprocessing.Pool's workers are not a DataLoader's
    pool = '  File "/usr/lib/python3.10/multiprocessing/pool.py", line 125, in worker\n'
    assert explain(pool + child) is None


def test_a_class_missing_from_a_packages_module_is_a_whole_pickled_model():
    got = explain("AttributeError: Can't get attribute 'C3k2' on <module 'ultralytics.nn.modules.block' from "
                  "'/venv/lib/site-packages/ultralytics/nn/modules/block.py'>")
    assert got.id == "pickled-class-missing"


def test_a_launchers_report_defers_to_the_workers_own_error():
    worker = "EOFError: Ran out of input\n"
    report = "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 19) of binary"
    assert explain(report).id == "distributed-launch"
    assert explain(worker + report).id == "corrupt-checkpoint"


def test_a_triton_frame_is_torch_compiles():
    pasted = normalise('  File "D:\\app\\venv\\Lib\\site-packages\\triton\\runtime\\build.py", line 139, in _build\n'
                       "subprocess.CalledProcessError: Command returned non-zero exit status 1.")
    assert frames(pasted) == [("triton/runtime/build.py", "_build")] and explain(pasted).chapter == 6


def test_the_onnx_packages_own_errors_are_chapter_6s():
    """The `onnx` package checks and shape-infers an exported file (chapter 6), as ONNX Runtime runs it: its frames
    and its exception classes place an error there, with its traceback or pasted without it."""
    import onnx                                                  # a pinned dependency: chapter 6 uses it
    from onnx import TensorProto, helper
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [size]) for name, size in (("a", 2), ("b", 3))]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g", inputs, [output])
    with pytest.raises(Exception) as raised:                    # [2] + [3]: shapes that do not broadcast
        onnx.shape_inference.infer_shapes(helper.make_model(graph), strict_mode=True)
    got = explain(raised.value)
    assert got.chapter == 6 and "innermost ONNX frame" in got.origin, got
    error = raised.value
    pasted = f"{type(error).__module__}.{type(error).__name__}: {error}"
    # its words match a template of torch.fx's type checker ("Incompatible dimensions"), a part no chapter teaches:
    # the exception class it names says where it was raised
    assert "Incompatible dimensions" in pasted and origin(normalise(pasted)).found_by == "exception"
    assert "[ShapeInferenceError]" in pasted and explain(pasted).chapter == 6
    assert explain(str(error)).chapter == 6                      # the tag alone
    # the same checker run by another framework's converter is not chapter 6's
    assert explain(f"paddle2onnx: {pasted}") is None and explain(f"skl2onnx {pasted}") is None


def test_the_python_bindings_argument_errors_are_pytorchs_and_pythons_own_are_not():
    with pytest.raises(TypeError) as torchs:
        torch.ones(2).unsqueeze((0, 1))                          # "unsqueeze(): argument 'dim' (position 1) ..."
    with pytest.raises(TypeError) as pythons:
        "a".replace(1, 2)                                        # "replace() argument 1 must be str, not int"
    got = explain(f"TypeError: {torchs.value}")
    assert got is not None and got.chapter == 1, got
    assert explain(f"TypeError: {pythons.value}") is None


def test_quantizations_and_the_attention_kernels_errors_are_chapter_6s_at_low_confidence():
    """Two parts of inference no section teaches, raised inside ATen (whose other files are tensor operations,
    chapter 1): quantized operators and their engines, and scaled_dot_product_attention's kernels."""
    engine = torch.backends.quantized.engine
    try:
        with pytest.raises(RuntimeError) as no_engine:          # "quantized engine NoQEngine is not supported"
            torch.backends.quantized.engine = "none"
        with pytest.raises(RuntimeError) as not_an_engine:      # "... is not a valid value for quantized engine"
            torch.backends.quantized.engine = "qnnpack_x"
    finally:
        torch.backends.quantized.engine = engine
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError) as no_kernel, sdpa_kernel(SDPBackend.CUDNN_ATTENTION):   # none on a CPU
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    for raised, area in ((no_engine, "area-quantization"), (not_an_engine, "area-quantization"),
                         (no_kernel, "area-attention")):
        for got in (explain(raised.value), explain(f"RuntimeError: {raised.value}")):
            assert (got.id, got.chapter, got.confidence) == (area, 6, "low"), (raised.value, got)


def test_an_internal_assertion_quoting_its_file_is_placed_by_it():
    """TorchScript's values (IValue) unpacked as the wrong kind, most often in LibTorch; newer releases quote the file
    of an internal assertion."""
    got = explain("terminate called after throwing an instance of 'c10::Error'\n  what():  isTuple() INTERNAL ASSERT "
                  'FAILED at "../aten/src/ATen/core/ivalue_inl.h":1916, please report a bug to PyTorch. Expected Tuple '
                  "but got String")
    assert got.id == "area-torchscript" and "ATen/core/ivalue_inl.h" in got.origin, got


@pytest.mark.parametrize("message, area", [
    # 1.x's words for cuBLAS failing to create its handle or workspace: the GPU's memory is taken, as today's
    # CUBLAS_STATUS_NOT_INITIALIZED / ALLOC_FAILED
    ("RuntimeError: cublas runtime error : library not initialized at /pytorch/aten/src/THC/THCGeneral.cpp:333",
     "area-memory"),
    ("RuntimeError: cublas runtime error : resource allocation failed at /pytorch/aten/src/THC/THCGeneral.cpp:228",
     "area-memory"),
    # torch_shm_manager serves the shared memory the DataLoader's workers pass batches through
    ('RuntimeError: error executing torch_shm_manager at "/env/lib/python3.9/site-packages/torch/bin/'
     'torch_shm_manager" at ../torch/lib/libshm/core.cpp:99', "area-data"),
    # ExecuTorch runs a torch.export'ed program: its frames, its runtime's checks and its log
    ('  File "/env/lib/python3.10/site-packages/executorch/exir/program/_program.py", line 1012, in to_executorch\n'
     "RuntimeError: Missing out variants: {'aten::foo'}", "area-export"),
    ("aten::_native_batch_norm_legit.no_stats_out Check failed (training == false): Portable kernels only support "
     "inference mode!", "area-export"),
])
def test_other_parts_named_by_their_words_or_files(message, area):
    got = explain(message)
    assert got is not None and got.id == area and got.confidence == "low", (message, got)


def test_1x_words_for_a_half_beside_a_float_are_half_precisions():
    """1.x's "Expected object of scalar type A but got scalar type B": Half or BFloat16 against Float or Double is
    chapter 6's dtype mismatch (a model or input left in float16); an index or label type expected is chapter 1's."""
    half = explain("RuntimeError: Expected object of scalar type Float but got scalar type Half for sequence element 2 "
                   "in sequence argument at position #1 'tensors'")
    assert (half.id, half.chapter) == ("dtype-mismatch", 6)
    labels = explain("RuntimeError: Expected object of scalar type Long but got scalar type Float for argument #2 "
                     "'target'")
    assert (labels.id, labels.chapter) == ("dtype-double-long", 1)
    target = explain("RuntimeError: Expected object of scalar type Long but got scalar type Half for argument #2 "
                     "'target'")
    assert (target.id, target.chapter) == ("dtype-double-long", 1)          # a label converted with .half()


def test_a_loss_that_turns_nan_in_a_log_and_kerass_progress_bar():
    for logged in ("[10] epoch 0, 10/186, g_loss nan d_fake_loss nan d_real_loss nan",
                   "Epoch: 12 mask_loss:  nan size_loss:  nan offset_loss:  nan"):
        assert explain(logged).id == "nan-loss", logged
    # Keras prints its progress bar and metrics so: its NaN loss is not for the chapters' advice
    for keras in ("Epoch 1/50\n41/41 [==============================] - 7s 51ms/step - loss: nan - accuracy: 0.6654",
                  " 64/500 [==>...........................] - ETA: 1:02 - loss: nan",
                  "1875/1875 [==============================] - 2s 820us/sample - loss: nan",
                  "41/41 ━━━━━━━━━━━━━━━━━━━━ 7s 51ms/step - loss: nan"):
        assert explain(keras) is None, keras


@pytest.mark.parametrize("message, chapter", [
    ("RuntimeError: received 0 items of ancdata", 2),                          # DataLoader workers' fd passing
    ("RuntimeError: Too many open files. Communication with the workers is no longer possible.", 2),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", 3),
    ("ValueError: SyncBatchNorm expected input tensor to be on GPU", 5),
    ("AssertionError: DistributedDataParallel is not needed when a module doesn't have any parameter that requires "
     "a gradient.", 5),
    ("NotImplementedError: The operator 'aten::foo' is not currently implemented for the MPS device.", 1),
    ("RuntimeError: index 7 is out of range at /pytorch/aten/src/TH/generic/THTensorEvenMoreMath.cpp:193", 3),
])
def test_kinds_no_rule_covers_are_placed_by_their_words_or_template(message, chapter):
    got = explain(message)
    assert got is not None and got.chapter == chapter and not got.causes, (message, got and got.id)   # placed


def test_pythons_own_index_error_and_installation_messages_are_not_placed():
    user_code = normalise('  File "/home/me/train.py", line 9, in <module>\n    import torch\n'
                          "IndexError: list index out of range")
    assert explain(user_code) is None
    assert explain("A module that was compiled using NumPy 1.x cannot be run in NumPy 2.0.0 as it may crash.\n"
                   '  File "/env/lib/python3.10/site-packages/torch/__init__.py", line 1477, in <module>') is None
    assert explain("FileNotFoundError: [Errno 2] No such file or directory: 'checkpoints/model.pth'") is None


def test_the_wrappers_own_reports_of_a_pytorch_failure_name_its_subject():
    # tuning-12: DeepSpeed's and fairseq's loss scaler, accelerate's batch-size search, ComfyUI's and DeepSpeed's
    # memory words, load_state_dict's result printed, a loader skipping a shape, a GPU too old for the build
    cases = {"[2024-09-11 17:52:18,030] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
             "Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648": 6,
             "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb, m, "
             "n, k, &falpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb, &fbeta, c, CUDA_R_16F, ldc, CUDA_R_32F)`": 6,
             "RuntimeError: No executable batch size found, reached zero.": 3,
             "[WARNING] [stage3.py:1939:step] 13 pytorch allocator cache flushes since last step. this happens when "
             "there is high memory pressure and is detrimental to performance.": 3,
             "_IncompatibleKeys(missing_keys=['head.weight', 'head.bias'], unexpected_keys=['fc.weight'])": 4,
             "WARNING [08/10 20:00:25 fvcore.common.checkpoint]: Skip loading parameter 'head.weight' to the model "
             "due to incompatible shapes: (80, 256) in the checkpoint but (227, 256) in the model!": 4,
             "Found GPU0 NVIDIA GTX TITAN Black which is of cuda capability 3.5. PyTorch no longer supports this GPU "
             "because it is too old. The minimum cuda capability supported by this library is 3.7.": 1,
             "RuntimeError: Torch is not able to use GPU; add --skip-torch-cuda-test to COMMANDLINE_ARGS variable "
             "to disable this check": 1}
    assert_placed_at_low_confidence(cases)
    # Triton's own minimum (torch.compile's backend) stays torch.compile's, not the device's
    triton = explain("RuntimeError: Found NVIDIA GeForce GTX 1080 which is too old to be supported by the triton GPU "
                     "compiler, which is used as the backend. Triton only supports devices of CUDA Capability >= 7.0")
    assert triton is not None and triton.chapter == 6


def test_an_unpickling_error_from_pythons_own_pickle_is_not_a_checkpoints():
    plain = ("UnpicklingError                           Traceback (most recent call last)\n"
             "----> 2     X = pickle.load(f)\nUnpicklingError: invalid load key, '\\x0a'.")
    assert explain(plain) is None
    assert explain(plain.replace("pickle.load(f)", "torch.load(f)")).id == "corrupt-checkpoint"


def test_more_of_the_wrappers_words_name_the_subject():
    # tuning-13: apex's and DeepSpeed's loss scaler, accelerate's and transformers' loaders, Lightning's metric
    # logging under DDP and its empty dataloader, vLLM's KV cache, a layer's function given a list
    cases = {"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.03125": 6,
             "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.": 6,
             'ValueError: Trying to set a tensor of shape torch.Size([4096, 1024]) in "weight" (which has shape '
             'torch.Size([4096, 512])), this looks incorrect.': 4,
             "Some weights of the model checkpoint were not used when initializing UNet2DConditionModel": 4,
             "It is recommended to use `self.log('val_loss', ..., sync_dist=True)` when logging on epoch level in "
             "distributed setting to accumulate the metric across devices.": 5,
             "Total length of `Dataloader` across ranks is zero. Please make sure that it returns at least 1 batch.": 2,
             "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored "
             "in KV cache (3664). Try increasing gpu_memory_utilization or decreasing max_model_len": 3,
             "TypeError: conv2d() received an invalid combination of arguments - got (list, Parameter, NoneType, "
             "tuple, tuple, tuple, int), but expected one of:": 2}
    assert_placed_at_low_confidence(cases)
    # the same words from TensorFlow's Keras stay unexplained
    assert explain("Some layers from the model checkpoint at bert-base-uncased were not used when initializing "
                   "TFBertModel: ['mlm___cls']") is None


def test_pythons_pickling_words_in_a_spawned_process_are_the_workers_not_torch_package():
    # torch.package's pickler repeats Python's "Can't pickle local object": with Windows' spawn frames and no
    # torch.package frame, the DataLoader's workers starting are the better guess
    message = ('  File "C:\\envs\\lib\\multiprocessing\\popen_spawn_win32.py", line 93, in __init__\n'
               '    reduction.dump(process_obj, to_child)\n'
               '  File "C:\\envs\\lib\\multiprocessing\\reduction.py", line 60, in dump\n'
               '    ForkingPickler(file, protocol).dump(obj)\n'
               "AttributeError: Can't pickle local object 'Queue.get_subjects_iterable.<locals>.<lambda>'")
    got = explain(message)
    assert got is not None and got.chapter == 2 and got.confidence == "low" and "spawn" in got.origin
