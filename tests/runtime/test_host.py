"""host: LLVM's host description, remembered on disk under a fingerprint of what it
depends on, so that a warm process need not load LLVM to key its kernels."""

import pytest

from tracegrad.runtime import disk_cache, host


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache directory and a process that has not described its host yet."""
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    monkeypatch.setattr(host, "_description", None)
    if host.fingerprint() is None:
        pytest.skip("no fingerprint on this system: LLVM is always asked")
    return tmp_path


def _llvm_unavailable(monkeypatch):
    def refuse():
        raise AssertionError("LLVM was asked")
    monkeypatch.setattr(host, "from_llvm", refuse)


def test_the_recorded_description_is_llvms_and_is_used_without_llvm(fresh, monkeypatch):
    live = host.from_llvm()
    assert host.description() == live
    monkeypatch.setattr(host, "_description", None)  # as a new process
    _llvm_unavailable(monkeypatch)
    assert host.description() == live


def test_another_fingerprint_asks_llvm(fresh, monkeypatch):
    host.description()
    monkeypatch.setattr(host, "_description", None)
    monkeypatch.setattr(host, "_cpu_identity", lambda: "flags : something else")
    asked = []
    monkeypatch.setattr(host, "from_llvm", lambda: asked.append(1) or "llvm-1.0-other-+x")
    assert host.description() == "llvm-1.0-other-+x" and asked


def test_a_malformed_record_is_not_used(fresh, monkeypatch):
    disk_cache.store(host._record_key(host.fingerprint()), host._RECORD, b"not a description")
    assert host.description() == host.from_llvm()


def test_the_cache_switched_off_asks_llvm_and_writes_nothing(fresh, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")
    assert host.description() == host.from_llvm()
    assert not any(fresh.iterdir())


def test_a_wrong_record_is_repaired_once_llvm_is_loaded(fresh, monkeypatch):
    disk_cache.store(host._record_key(host.fingerprint()), host._RECORD, b"llvm-1.0-wrong-+avx")
    assert host.description() == "llvm-1.0-wrong-+avx"
    host.confirm()
    live = host.from_llvm()
    assert host.description() == live
    monkeypatch.setattr(host, "_description", None)
    assert host.description() == live  # from the repaired record


def test_features_are_parsed_from_the_description(monkeypatch):
    monkeypatch.setattr(host, "_description", "llvm-22.1.0-x86-64-+avx,-avx512f,+fma")
    assert host.features() == {"avx": True, "avx512f": False, "fma": True}
    monkeypatch.setattr(host, "_description", "llvm-22.1.0-skylake-avx512-")
    assert host.features() == {}


def test_features_agree_with_llvm(fresh):
    import llvmlite.binding as llvm
    assert host.features() == dict(llvm.get_host_cpu_features())
