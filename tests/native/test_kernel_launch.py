"""The kernel launch ABI end to end with a hand-written kernel that needs a workspace.

tests/native_fixture/workspace_kernel.cpp declares 4096 workspace bytes, fills every byte
and reports what it received. It is launched through a wrapper rendered from
backends/cpu/templates/cpu_wrapper.cpp.j2, first from Python (aotpack.backends.host.launch_abi), then
from a model.so rendered from backends/cpu/templates/model.cpp.j2 inside an archive run by aotpack-run:
both callers must allocate the workspace the wrapper's TilingInfo declares.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from aotpack import env
from aotpack.archive import layout
from aotpack.backends.cpu import cpp_wrapper
from aotpack.backends.cpu import wrapper_slot
from aotpack.backends.host import launch_abi
from aotpack.errors import AotpackError
from aotpack.backends.cpu.templating import render


REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "native" / "include"
KERNEL_SOURCE = REPO / "tests" / "native_fixture" / "workspace_kernel.cpp"
RUN = REPO / "native" / "build" / "aotpack-run"
FLAGS = ["g++", "-O2", "-fPIC", "-shared", "-std=c++17"]
WORKSPACE = 4096
KEY = "ws0"
NAME = "wsk"
# block_dim 4: above every thread cap below, so the launch's max_threads reaches the kernel
TILING = SimpleNamespace(kernel_key=KEY, tiling_repr="fixture;workspace=4096", workspace=WORKSPACE, block_dim=4)


def _fixture_module():
    spec = importlib.util.spec_from_file_location("aotpack_native_fixture",
                                                  REPO / "tests" / "native_fixture" / "make_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_kernel(kernel_dir: Path, *defines: str) -> Path:
    """workspace_kernel.cpp -> kernel_dir/static_kernel/ws0/kernel.so."""
    out = kernel_dir / layout.STATIC_KERNEL_DIR / KEY / layout.LIB_KERNEL_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*FLAGS, f"-I{INCLUDE}", *defines, str(KERNEL_SOURCE), "-o", str(out)], check=True)
    return out


def compile_wrapper(kernel_dir: Path, tilings=(TILING,)) -> Path:
    """The generated wrapper of ``tilings`` (default: the one TILING, workspace 4096) ->
    kernel_dir/wrapper.so."""
    source = kernel_dir / layout.WRAPPER_SOURCE_NAME
    source.write_text(wrapper_slot.render(list(tilings)))
    out = kernel_dir / layout.WRAPPER_NAME
    subprocess.run([*FLAGS, str(source), "-o", str(out), "-ldl"], check=True)
    return out


def expected_sum(seed: int) -> int:
    return int(((seed + np.arange(WORKSPACE)) & 0xFF).sum())


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wsk")
    compile_kernel(folder)
    compile_wrapper(folder)
    return folder


@pytest.fixture
def launcher(kernel_dir):
    lib = ctypes.CDLL(str(kernel_dir / layout.WRAPPER_NAME), mode=ctypes.RTLD_LOCAL)
    launcher = launch_abi.WrapperLauncher(lib, "kernel wsk", max_threads=3)
    assert launcher.init(kernel_dir) == 1
    return launcher


def probe_args(seed: int):
    seed_array, probe = np.array([seed], dtype=np.int64), np.zeros(4, dtype=np.int64)
    return seed_array, probe, [seed_array.ctypes.data, probe.ctypes.data]


def test_ctypes_layout_matches_the_compiler(tmp_path):
    source = tmp_path / "layout.cpp"
    source.write_text('#include <cstddef>\n#include <cstdio>\n#include "aotpack/kernel_abi.h"\n'
                      "#define F(S, f) std::printf(\"%zu \", offsetof(S, f))\n"
                      "int main() { std::printf(\"%zu %zu %u \", sizeof(AotpackKernelLaunch), "
                      "sizeof(AotpackTilingInfo), AOTPACK_KERNEL_LAUNCH_V1_SIZE);\n"
                      + "".join(f"F(AotpackKernelLaunch, {f});" for f, _ in launch_abi.KernelLaunch._fields_)
                      + "".join(f"F(AotpackTilingInfo, {f});" for f, _ in launch_abi.TilingInfoStruct._fields_)
                      + "}\n")
    subprocess.run(["g++", "-std=c++17", f"-I{INCLUDE}", str(source), "-o", str(tmp_path / "layout")], check=True)
    got = [int(v) for v in subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True,
                                          check=True).stdout.split()]
    expected = [ctypes.sizeof(launch_abi.KernelLaunch), ctypes.sizeof(launch_abi.TilingInfoStruct),
                launch_abi.KernelLaunch.max_threads.offset + 4]
    expected += [getattr(launch_abi.KernelLaunch, f).offset for f, _ in launch_abi.KernelLaunch._fields_]
    expected += [getattr(launch_abi.TilingInfoStruct, f).offset for f, _ in launch_abi.TilingInfoStruct._fields_]
    assert got == expected


def test_python_launcher_allocates_the_declared_workspace(launcher):
    assert launcher.tiling_info(KEY) == launch_abi.TilingInfo("fixture;workspace=4096", WORKSPACE, 4)
    seed, probe, args = probe_args(7)
    launcher.launch(KEY, args)
    assert probe.tolist() == [WORKSPACE, 0, expected_sum(7), 3]
    seed[0] = 200
    launcher.launch(KEY, args)  # the same workspace, written again
    assert probe.tolist() == [WORKSPACE, 0, expected_sum(200), 3]
    launcher.release(KEY)


def test_wrapper_caps_each_launch_at_its_candidates_block_dim(tmp_path):
    """Candidates that differ only in block_dim share one binary (Backend.share_binaries):
    the wrapper lowers max_threads to the launched candidate's block_dim."""
    binary = compile_kernel(tmp_path)
    one_thread = SimpleNamespace(**{**vars(TILING), "kernel_key": "ws1", "block_dim": 1})
    shared = tmp_path / layout.STATIC_KERNEL_DIR / "ws1" / layout.LIB_KERNEL_NAME
    shared.parent.mkdir(parents=True)
    os.link(binary, shared)
    wrapper = compile_wrapper(tmp_path, (TILING, one_thread))
    threads = {}
    for cap in (0, 3):
        launcher = launch_abi.WrapperLauncher(ctypes.CDLL(str(wrapper), mode=ctypes.RTLD_LOCAL), "kernel wsk",
                                              max_threads=cap)
        assert launcher.init(tmp_path) == 2
        for key in (KEY, "ws1"):
            seed, probe, args = probe_args(5)
            launcher.launch(key, args)
            assert probe.tolist()[:3] == [WORKSPACE, 0, expected_sum(5)]
            threads[cap, key] = probe.tolist()[3]
    assert threads == {(0, KEY): 4, (0, "ws1"): 1, (3, KEY): 3, (3, "ws1"): 1}


def test_wrapper_refuses_bad_launches(launcher):
    _, probe, ptrs = probe_args(1)
    args = (ctypes.c_void_p * 2)(*ptrs)
    lib = launcher.lib

    def launch(**fields) -> str:
        base = dict(struct_size=ctypes.sizeof(launch_abi.KernelLaunch), device_type=launch_abi.DEVICE_CPU)
        launch = launch_abi.KernelLaunch(**{**base, **fields})
        assert lib.aotpack_launch(KEY.encode(), ctypes.byref(launch), args) != 0
        return launcher.error()

    buffer = ctypes.create_string_buffer(WORKSPACE)
    assert launch(workspace=ctypes.addressof(buffer), workspace_bytes=100) == \
        "kernel ws0 needs a workspace of 4096 bytes, got 100"
    assert launch() == "kernel ws0 needs a workspace of 4096 bytes, got 0"
    full = dict(workspace=ctypes.addressof(buffer), workspace_bytes=WORKSPACE)
    assert launch(device_type=2, **full) == \
        "kernel ws0 refused the launch: wrong device (this kernel runs on CPU device 0 only)"
    assert launch(struct_size=8, **full) == "kernel ws0 refused the launch: launch struct missing or too small"
    assert launch(max_threads=-1, **full) == "kernel ws0 refused the launch: max_threads must be >= 0"
    assert probe.tolist() == [0, 0, 0, 0]  # nothing ran
    with pytest.raises(AotpackError, match="^kernel wsk: unknown kernel_key: nope$"):
        launcher.tiling_info("nope")
    with pytest.raises(AotpackError, match="^kernel wsk: unknown kernel_key: nope$"):
        launcher.launch("nope", ptrs)
    assert lib.aotpack_launch(b"nope", ctypes.byref(launch_abi.KernelLaunch()), args) != 0
    assert launcher.error() == "kernel_key not loaded: nope"


@pytest.mark.parametrize("define, message", [
    ("-DAOTPACK_FIXTURE_ABI_MAJOR=2",
     "implements kernel ABI 2.0, this wrapper implements 1.0 (the major must match); rebuild it with this aotpack"),
    ("-DAOTPACK_FIXTURE_OLD_ABI",
     "lacks aotpack_kernel_abi_version/aotpack_kernel_launch (built by an older aotpack); "
     "rebuild it with this aotpack"),
], ids=["other-major", "pre-abi"])
def test_wrapper_refuses_kernels_of_another_abi(tmp_path, define, message):
    kernel = compile_kernel(tmp_path, define)
    launcher = launch_abi.WrapperLauncher(ctypes.CDLL(str(compile_wrapper(tmp_path)), mode=ctypes.RTLD_LOCAL),
                                          "kernel wsk")
    with pytest.raises(AotpackError) as info:
        launcher.init(tmp_path)
    assert str(info.value) == f"kernel wsk: init failed: {kernel} {message}"


def test_launcher_refuses_a_wrapper_of_another_major(tmp_path):
    source = tmp_path / "fake.cpp"
    source.write_text('extern "C" { int aotpack_kernel_abi_version() { return 2 << 16; }\n'
                      + "".join(f"void {f}() {{}}\n" for f in ("aotpack_init", "aotpack_tiling_info", "aotpack_launch",
                                                              "aotpack_release", "aotpack_last_error"))
                      + "}\n")
    subprocess.run([*FLAGS, str(source), "-o", str(tmp_path / "fake.so")], check=True)
    with pytest.raises(AotpackError, match=r"^kernel x: .*fake\.so implements kernel ABI 2\.0, aotpack implements "
                                           r"1\.0 \(the major must match\); remove it and build again$"):
        launch_abi.WrapperLauncher(ctypes.CDLL(str(tmp_path / "fake.so")), "kernel x")


def _archive(tmp_path: Path, kernel_dir: Path) -> Path:
    """An archive whose generated model.so launches the workspace kernel once per run."""
    fx = _fixture_module()
    lit = cpp_wrapper.KernelLiteral(NAME, layout.wrapper_path(NAME), layout.kernel_dir(NAME),
                                    layout.lib_kernel_path(NAME, KEY), KEY)
    array_lines = ["constexpr int64_t kOne[] = {1};", "constexpr int64_t kFour[] = {4};"]
    run_lines = [
        "Tensor in0 = conform(Tensor(inputs[0], false), 1, kOne, kOne, 4);",
        "Tensor probe = alloc(1, kFour, kOne, 4);",
        "void* const args[] = {ptr(in0), ptr(probe)};",
        "m.kernels[0].launch(args);",
        'check(g_host->as_strided(probe.get(), 1, kFour, kOne, 0, &outputs[0]), "output");',
    ]
    source = render("model.cpp.j2", kernels=[lit], ops=[], typed=[], pack_lines=[], num_packed=0, panel_packs=False,
                    run_lines=run_lines, array_lines=array_lines, num_constants=0, num_inputs=1,
                    num_outputs=1, abi_version=cpp_wrapper.MODEL_ABI_VERSION, name="wsk", version="0.1.0",
                    aotpack_version="test", device_limit=3, profile_variable=env.PROFILE.name)
    (tmp_path / "model.cpp").write_text(source)
    subprocess.run([*FLAGS, f"-I{INCLUDE / 'aotpack'}", str(tmp_path / "model.cpp"), "-o",
                    str(tmp_path / "model.so"), "-ldl"], check=True)
    files = {layout.MODEL_LIBRARY_PATH: (tmp_path / "model.so").read_bytes(), layout.MODEL_SOURCE_PATH: source.encode(),
             layout.wrapper_path(NAME): (kernel_dir / layout.WRAPPER_NAME).read_bytes(),
             layout.lib_kernel_path(NAME, KEY): (kernel_dir / layout.STATIC_KERNEL_DIR / KEY /
                                                 layout.LIB_KERNEL_NAME).read_bytes()}
    manifest = fx.make_manifest(files, name="wsk", constants=[], mutated_buffers=[],
                                inputs=[fx.spec("seed", "int64", [1], [1])],
                                outputs=[fx.spec("probe", "int64", [4], [1])])
    return fx.write_archive(tmp_path / "wsk-0.1.0.aotpack", manifest, files)


@pytest.mark.parametrize("limit_args, threads", [([], 3), (["--device-limit", "2"], 2)], ids=["build-limit", "limit-2"])
def test_generated_model_allocates_the_workspace(tmp_path, kernel_dir, limit_args, threads):
    if not RUN.exists():
        pytest.fail(f"{RUN} is missing; build native/ first (native/README.md)")
    archive = _archive(tmp_path, kernel_dir)
    np.save(tmp_path / "seed.npy", np.array([42], dtype=np.int64))
    result = subprocess.run([str(RUN), str(archive), str(tmp_path / "seed.npy"), "--output", str(tmp_path / "o.npz"),
                             *limit_args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "o.npz") as out:
        assert out["probe"].tolist() == [WORKSPACE, 0, expected_sum(42), threads]


def test_profile_table_counts_every_launch(tmp_path, kernel_dir):
    """AOTPACK_PROFILE=1: the generated model.so times each launch and prints the table
    to stderr when the model is destroyed; unset, it prints nothing."""
    if not RUN.exists():
        pytest.fail(f"{RUN} is missing; build native/ first (native/README.md)")
    archive = _archive(tmp_path, kernel_dir)
    np.save(tmp_path / "seed.npy", np.array([42], dtype=np.int64))
    command = [str(RUN), str(archive), str(tmp_path / "seed.npy"), "--bench", "5", "--warmup", "2"]
    profiled = subprocess.run(command, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "AOTPACK_PROFILE": "1"})
    assert profiled.returncode == 0, profiled.stderr
    lines = profiled.stderr.splitlines()
    assert lines[:2] == ["aotpack profile of wsk 0.1.0 (kernel launches only; us):",
                         "  kernel                              calls     total_us    us/call   share"]
    # the 5 --bench runs and the 2 warm-ups
    assert re.fullmatch(r"  wsk +7 +\d+ +\d+\.\d +100\.0%", lines[2]), lines
    assert len(lines) == 3
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "AOTPACK_PROFILE": "0"})
    assert quiet.returncode == 0 and quiet.stderr == ""


def _two_tilings():
    return (TILING, SimpleNamespace(**{**vars(TILING), "kernel_key": "ws1", "tiling_repr": "fixture;b", "block_dim": 1}))


def _launcher(wrapper: Path) -> launch_abi.WrapperLauncher:
    return launch_abi.WrapperLauncher(ctypes.CDLL(str(wrapper), mode=ctypes.RTLD_LOCAL), "kernel wsk")


def test_a_patched_wrapper_matches_its_compiled_source(tmp_path):
    """The toolchain writes each wrapper's map into one slot binary (wrapper_slot): the
    result reports and launches like the wrapper compiled from the source it ships."""
    from aotpack.backends.cpu.toolchain import CpuToolchain
    source = tmp_path / "wrapper.cpp"
    source.write_text(wrapper_slot.render(list(_two_tilings())))
    toolchain = CpuToolchain("native", slot_dir=tmp_path / "binaries")
    for variant in ("patched", "compiled"):
        (tmp_path / variant).mkdir()
    toolchain.compile_wrapper(source, tmp_path / "patched" / layout.WRAPPER_NAME)
    CpuToolchain("native").compile_wrapper(source, tmp_path / "compiled" / layout.WRAPPER_NAME)
    (slot,) = (tmp_path / "binaries").glob("*/lib.so")
    patched = (tmp_path / "patched" / layout.WRAPPER_NAME).read_bytes()
    assert len(patched) == slot.stat().st_size and wrapper_slot.MARKER.encode() not in patched
    for variant in ("patched", "compiled"):
        folder = tmp_path / variant
        compile_kernel(folder)
        launcher = _launcher(folder / layout.WRAPPER_NAME)
        assert launcher.init(folder) == 1  # ws1's kernel.so is absent, as in a shipped archive
        assert launcher.tiling_info(KEY) == launch_abi.TilingInfo("fixture;workspace=4096", WORKSPACE, 4)
        assert launcher.tiling_info("ws1") == launch_abi.TilingInfo("fixture;b", WORKSPACE, 1)
        seed, probe, args = probe_args(9)
        launcher.launch(KEY, args)
        assert probe.tolist() == [WORKSPACE, 0, expected_sum(9), 4]


def test_a_wrapper_with_a_malformed_map_refuses_to_init(tmp_path):
    from aotpack.backends.cpu.toolchain import CpuToolchain
    source = tmp_path / "wrapper.cpp"
    source.write_text(wrapper_slot.render([TILING]))
    CpuToolchain("native", slot_dir=tmp_path / "binaries").compile_wrapper(source, tmp_path / "w.so")
    good = (tmp_path / "w.so").read_bytes()
    line = f"{KEY}|fixture;workspace=4096|{WORKSPACE}|4\n".encode()
    assert good.count(line) == 1
    for bad in (f"{KEY}|fixture|4096\n", f"{KEY}|fixture|4096|x\n", f"{KEY}|fixture|4096|0\n"):
        damaged = tmp_path / f"bad{len(list(tmp_path.glob('bad*')))}.so"
        damaged.write_bytes(good.replace(line, bad.encode().ljust(len(line), b"\0")))
        with pytest.raises(AotpackError) as info:
            _launcher(damaged).init(tmp_path)
        assert str(info.value) == "kernel wsk: init failed: this wrapper's tiling map is malformed (a damaged wrapper.so)"


def test_only_a_wrapper_of_the_slots_template_is_patched():
    slot = wrapper_slot.slot_source()
    source = wrapper_slot.render([TILING])
    assert wrapper_slot.patched(b"\0" + wrapper_slot.MARKER.encode() + b"\0" * wrapper_slot.MAP_BYTES, source, slot)
    assert wrapper_slot.patched(b"x", source, slot) is None                       # no marker in the binary
    assert wrapper_slot.patched(b"\0" * 8, source.replace("kCount = 0", "kCount = 1"), slot) is None
    with pytest.raises(AotpackError, match="cannot go into a wrapper's map"):
        wrapper_slot.map_text([SimpleNamespace(**{**vars(TILING), "tiling_repr": 'a"b'})])
