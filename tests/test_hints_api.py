"""neuralcache.hints path handling (no mount needed)."""
import pytest

from neuralcache.hints import HintError, _relative


def test_relative_paths_inside_and_outside_the_mount():
    assert _relative("/mnt", "/mnt/a/b.bin") == "a/b.bin"
    assert _relative("/mnt", "/mnt/..foo") == "..foo"          # a file named ..foo
    assert _relative("/mnt", "rel/path") == "rel/path"
    with pytest.raises(HintError):
        _relative("/mnt", "/other/x")
    with pytest.raises(HintError):
        _relative("/mnt", "/mnt/../etc/passwd")
