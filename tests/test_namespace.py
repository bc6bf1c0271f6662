"""The namespace snapshot and inode table, without a kernel."""
from neuralcache.backends.base import ObjectInfo, valid_key
from neuralcache.namespace import ROOT_INODE, Namespace


def objs(*items):
    return [ObjectInfo(k, s, v, 1.0) for k, s, v in items]


def test_tree_from_keys():
    ns = Namespace()
    ns.apply_listing(objs(("a/b/c.bin", 10, "e1"), ("a/d.bin", 5, "e2"), ("top", 1, "e3")))
    a = ns.child(ROOT_INODE, "a")
    assert a.is_dir and set(a.children) == {"b", "d.bin"}
    c = ns.by_path("a/b/c.bin")
    assert c.size == 10 and c.version == "e1" and not c.is_dir
    assert ns.files == 3 and ns.total_bytes == 16
    assert ns.files_in_order() == [("a/b/c.bin", 10), ("a/d.bin", 5), ("top", 1)]


def test_object_and_prefix_conflict_shows_directory():
    ns = Namespace()
    ns.apply_listing(objs(("x", 3, "e1"), ("x/y", 4, "e2")))
    x = ns.child(ROOT_INODE, "x")
    assert x.is_dir and "y" in x.children
    assert ns.files == 1


def test_inodes_stable_and_changes_reported():
    ns = Namespace()
    ns.apply_listing(objs(("d/f1", 1, "v1"), ("d/f2", 1, "v1")))
    f1 = ns.by_path("d/f1").inode
    d = ns.by_path("d").inode
    changed = ns.apply_listing(objs(("d/f1", 2, "v2"), ("d/f2", 1, "v1"), ("d/f3", 1, "v")))
    assert ns.by_path("d/f1").inode == f1 and ns.by_path("d").inode == d
    assert [n.key for n in changed] == ["d/f1"]
    assert ns.get(f1).size == 2


def test_lookup_counts_keep_removed_entries_until_forget():
    ns = Namespace()
    ns.apply_listing(objs(("gone", 1, "v"), ("stay", 1, "v")))
    gone = ns.by_path("gone")
    ns.remember(gone)
    ns.remember(gone)
    ns.apply_listing(objs(("stay", 1, "v")))
    assert ns.child(ROOT_INODE, "gone") is None       # not visible by name
    assert ns.get(gone.inode) is not None             # still resolvable by inode
    assert ns.get(gone.inode).removed
    ns.forget(gone.inode, 1)
    assert ns.get(gone.inode) is not None
    ns.forget(gone.inode, 1)
    assert ns.get(gone.inode) is None


def test_lookup_count_survives_relisting():
    ns = Namespace()
    ns.apply_listing(objs(("f", 1, "v")))
    ns.remember(ns.by_path("f"))
    ns.apply_listing(objs(("f", 1, "v")))
    assert ns.by_path("f").lookups == 1


def test_valid_key_rejects_escapes():
    for bad in ["", "/abs", "a//b", "../x", "a/../b", "a/./b", "x\x00y", "a/" + "n" * 256]:
        assert not valid_key(bad), bad
    for good in ["a", "a b/ü.bin", "..hidden", "x/...", "n" * 255]:
        assert valid_key(good), good
