"""Which llama.cpp build a CPU gets (seal_lite/engines/llama_build.py), the refusal of one it cannot run, and that
scripts/setup.sh installed the build this machine's CPU gets."""

import subprocess
import sys

import pytest

from seal_lite.engines import llama_build
from seal_lite.engines.llama_build import BUILDS, chosen_build, cpu_flags, mismatch

SAPPHIRE_RAPIDS = ("fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi "
                   "avx512_vnni avx512_bf16 amx_tile amx_int8")
EPYC_ZEN3 = "fpu sse4_2 avx avx2 fma f16c bmi2 sha_ni vaes"
SKYLAKE_X = "fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512dq avx512cd avx512bw avx512vl"  # no VBMI, no VNNI


def cpuinfo(flags: str) -> str:
    return f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"


def test_flags_are_read_from_cpuinfo():
    assert cpu_flags(cpuinfo(EPYC_ZEN3)) == set(EPYC_ZEN3.split())
    assert cpu_flags("processor\t: 0\nFeatures\t: fp asimd\n") == set()  # an ARM CPU names them otherwise


@pytest.mark.parametrize(("flags", "build"), [(SAPPHIRE_RAPIDS, "avx512"), (EPYC_ZEN3, "generic"),
                                              (SKYLAKE_X, "generic"), ("fp asimd", "generic")])
def test_each_cpu_gets_the_fastest_build_it_can_run(flags, build):
    name, cmake_args = chosen_build(cpu_flags(cpuinfo(flags)))
    assert name == build and cmake_args == BUILDS[build][1]
    assert "-DGGML_NATIVE=OFF" in cmake_args  # never -march=native: that compiles the AMX kernels that segfaulted


def test_unknown_flags_get_the_generic_build():
    assert chosen_build(None)[0] == "generic"


def test_the_users_cmake_args_win_and_name_their_own_build():
    name, cmake_args = chosen_build(cpu_flags(cpuinfo(SAPPHIRE_RAPIDS)), "-DGGML_NATIVE=ON")
    assert cmake_args == "-DGGML_NATIVE=ON" and name.startswith("custom-")
    assert chosen_build(None, "-DGGML_NATIVE=ON")[0] == name != chosen_build(None, "-DGGML_BLAS=ON")[0]


def test_a_build_the_cpu_cannot_run_is_refused_with_the_fix():
    why = mismatch("avx512", cpu_flags(cpuinfo(EPYC_ZEN3)))
    assert why is not None and "scripts/setup.sh" in why
    assert "avx512f" in why and "avx512_vnni" in why and "avx2" not in why  # names what is missing, only that
    assert mismatch("avx512", cpu_flags(cpuinfo(SAPPHIRE_RAPIDS))) is None
    assert mismatch("generic", set()) is None
    assert mismatch("custom-0123abcd", set()) is None  # the user's flags: not checked
    assert mismatch("", set()) is None  # not installed by setup.sh: unknown


def test_the_generators_refuse_before_loading_llama_cpp(monkeypatch, tmp_path):
    from seal_lite.engines.serving import BackendError, InProcessModel

    marker = tmp_path / "llama-cpp-build"
    marker.write_text("avx512\n")
    monkeypatch.setattr(llama_build, "INSTALLED", marker)
    monkeypatch.setattr(llama_build, "cpu_flags", lambda: set(EPYC_ZEN3.split()))
    with pytest.raises(BackendError, match="compiled for avx512 CPUs"):
        InProcessModel(str(tmp_path / "absent.gguf"))


def test_setup_installed_the_build_this_cpu_gets():
    """scripts/setup.sh put the chosen build in this environment, and llama.cpp reports its instructions."""
    import llama_cpp

    name, _ = chosen_build(cpu_flags())
    assert llama_build.INSTALLED.read_text().strip() == name
    system = llama_cpp.llama_print_system_info().decode()
    assert ("AVX512 = 1" in system) == (name == "avx512"), system


def test_setup_reads_the_choice_from_the_file_run_alone():
    """setup.sh runs the module as a file, before seal-lite is installed: it must print NAME VERSION CMAKE_ARGS."""
    printed = subprocess.run([sys.executable, llama_build.__file__], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin"}).stdout.split(maxsplit=2)
    assert printed[:2] == [chosen_build(cpu_flags())[0], llama_build.LLAMA_CPP_PYTHON]
    assert printed[2].strip() == chosen_build(cpu_flags())[1]


@pytest.mark.parametrize(("installed", "flags", "ok", "note", "fix"), [
    ("avx512", SAPPHIRE_RAPIDS, True, "avx512 build (this CPU's)", None),
    ("generic", SAPPHIRE_RAPIDS, True, "this CPU runs the avx512 build", "bash scripts/setup.sh"),
    ("generic", EPYC_ZEN3, True, "generic build (this CPU's)", None),
    ("avx512", EPYC_ZEN3, False, "lacks avx512", "bash scripts/setup.sh"),
    ("custom-0123abcd", EPYC_ZEN3, True, "(CMAKE_ARGS)", None),
    (None, EPYC_ZEN3, True, "built outside scripts/setup.sh", None),
])
def test_doctor_names_the_build_and_the_one_this_cpu_gets(monkeypatch, tmp_path, installed, flags, ok, note, fix):
    from seal_lite.runs import doctor

    marker = tmp_path / "llama-cpp-build"
    if installed:
        marker.write_text(installed + "\n")
    monkeypatch.setattr(llama_build, "INSTALLED", marker)
    monkeypatch.setattr(llama_build, "cpu_flags", lambda: set(flags.split()))
    row = doctor._llama_cpp_build()
    assert row.get("ok", True) is ok and note in row["note"] and row.get("fix") == fix
