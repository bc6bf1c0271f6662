"""The peers: what ML users pick instead of a mount, as *client* systems of the benchmark.

* ``s3torchconnector`` -- AWS's connector (the Mountpoint CRT client under PyTorch
  datasets): ``S3MapDataset`` / ``S3IterableDataset`` straight on the original objects,
  ``endpoint=`` the WAN proxy, ``S3ClientConfig(force_path_style=True)``.  Scenarios:
  samples, shards, bigfile, train-files; checkpoint (``S3Checkpoint``, same client
  configuration).
* ``mosaic`` -- MosaicML Streaming: the dataset converted once to MDS shards in the
  bucket (``mds/<dataset>/``), read with ``StreamingDataset`` and a PyTorch DataLoader
  as its docs recommend (its ``batch_size`` = the loader's, persistent workers).
  Scenarios: samples, train-files.
* ``litdata`` -- Lightning's LitData: ``litdata.optimize`` chunks in the bucket
  (``litdata/<dataset>/``), read with ``StreamingDataset`` + ``StreamingDataLoader``.
  Scenarios: samples, train-files.

Each has a ``-tuned`` row with settings for a 60 ms link where the defaults are unfair
(``TUNING``; bench/README.md says what and why).  Every peer reads through the same WAN
proxy as the mounts, verifies every sample or object by xxh3 against the manifest, and
its CPU (this process, its loader workers) is counted by the harness like every system's.

A client system is not a mount: ``open()`` yields a ``Mounted`` with ``kind="client"``,
no root, and ``client``: an object with this peer's own version of each workload
(``samples_epoch``, ``shards_epoch``, ``bigfile_read``, ``train_loader``), each returning
the same row fields as the mounts' workloads.  The converted copies (MDS, LitData
chunks) are made once per run from the local copy of the dataset, in a subprocess
(``python -m bench.systems.peers convert``: LitData's optimize switches multiprocessing
to spawn, which must not leak into the benchmark process), and put straight into
SeaweedFS, not through the link; the time and size go into each row's ``conversion`` (a
note, not counted).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import xxhash

from bench.systems import loader as tf   # the train-files loader contract
from bench.systems.base import MountOptions, Mounted, System, SystemEnv, SystemUnavailable
from bench.systems.reads import READ_CHUNK, SAMPLE_THREADS, shuffled

# name -> (module to import, pip name, scenarios it runs in)
PEERS = {
    "s3torchconnector": ("s3torchconnector", "s3torchconnector",
                         ("samples", "shards", "bigfile", "train-files", "checkpoint")),
    "mosaic": ("streaming", "mosaicml-streaming", ("samples", "train-files")),
    "litdata": ("litdata", "litdata", ("samples", "train-files")),
}
# What the -tuned rows change (README: "Peers").  Defaults: s3torchconnector 8 readers /
# 8 DataLoader workers (the scenario's) / one shard reader; mosaic predownload 8 x batch
# per worker, 64 MiB shards; litdata max_pre_download 2 chunks of 64 MB.  Tuned shard /
# chunk size 8 MB: a worker's first sample waits for a whole shard, and a dataset of a
# few hundred MB in 64 MB pieces leaves 8 workers without enough pieces to fetch in
# parallel (a separate converted copy).  s3torchconnector has no tuned bigfile
# row: its CRT client already splits one object into parallel 8 MiB ranged GETs, and
# refuses parts under 5 MiB.
TUNING = {
    "s3torchconnector": {"readers": 32, "workers": 32, "shard_readers": 4},
    "mosaic": {"workers": 8, "predownload_batches": 32, "shard_mb": 8},
    "litdata": {"workers": 8, "max_pre_download": 8, "shard_mb": 8},
}
TUNED_SCENARIOS = {"s3torchconnector": ("samples", "shards", "train-files")}
INSTALL_HINT = "pip install -e '.[peers]'"


def base(name: str) -> str:
    return name.removesuffix("-tuned")


def scenarios_of(name: str) -> tuple[str, ...]:
    if name.endswith("-tuned") and base(name) in TUNED_SCENARIOS:
        return TUNED_SCENARIOS[base(name)]
    return PEERS[base(name)][2]


def missing(name: str) -> str | None:
    """None when peer ``name`` can run here, else one line saying why not."""
    mod, pip, _ = PEERS[base(name)]
    for m, p in (("torch", "torch"), (mod, pip)):
        if importlib.util.find_spec(m) is None:
            return f"{p} not installed ({INSTALL_HINT})"
    return None


def import_streaming():
    """``streaming.base`` (StreamingDataset, MDSWriter) without ``streaming/__init__``.

    The package's ``__init__`` imports its vision/text helpers, which import
    torchvision; the torchvision wheels this project's machines can install are CUDA
    builds that do not load against the CPU torch.  The benchmark needs none of them.
    """
    try:
        import streaming.base as sb
        return sb
    except ImportError:
        pass
    for k in [k for k in sys.modules if k == "streaming" or k.startswith("streaming.")]:
        del sys.modules[k]
    spec = importlib.util.find_spec("streaming")
    pkg = types.ModuleType("streaming")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    sys.modules["streaming"] = pkg
    import streaming.base as sb
    return sb


def import_peer(peer: str):
    """The peer's library, imported the way its workload imports it (MosaicML's
    without ``streaming/__init__``: see ``import_streaming``)."""
    if peer == "mosaic":
        return import_streaming()
    return importlib.import_module(PEERS[peer][0])


# -- conversion (run in a subprocess) -----------------------------------------------------
def _lit_item(item):
    src, rel = item
    with open(os.path.join(src, rel), "rb") as f:
        return {"path": rel, "label": tf.label_of(rel), "jpg": f.read()}


def convert(fmt: str, src: Path, manifest: dict, out: Path, shard_mb: int | None = None) -> None:
    """Write ``manifest``'s files under ``src`` as ``fmt`` ("mds" | "litdata") to ``out``,
    with each library's default shard / chunk size (or ``shard_mb`` MB), no compression."""
    rels = sorted(manifest["files"])
    shutil.rmtree(out, ignore_errors=True)
    if fmt == "mds":
        sb = import_streaming()
        kw = {"size_limit": shard_mb << 20} if shard_mb else {}
        with sb.MDSWriter(out=str(out), columns={"path": "str", "label": "int",
                                                 "jpg": "bytes"}, **kw) as w:
            for rel in rels:
                w.write({"path": rel, "label": tf.label_of(rel),
                         "jpg": (src / rel).read_bytes()})
    elif fmt == "litdata":
        import litdata
        litdata.optimize(fn=_lit_item, inputs=[(str(src), rel) for rel in rels],
                         output_dir=str(out), chunk_bytes=f"{shard_mb or 64}MB",
                         mode="overwrite")
    else:
        raise ValueError(fmt)


def _s3(env: SystemEnv, endpoint: str):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint, region_name=env.region,
                        aws_access_key_id=env.access_key, aws_secret_access_key=env.secret_key,
                        config=Config(s3={"addressing_style": "path"},
                                      max_pool_connections=16))


def converted(env: SystemEnv, fmt: str, ds_name: str, manifest: dict, work: Path,
              shard_mb: int | None = None) -> dict:
    """Make sure ``FMT[-Nmb]/<ds_name>/`` in the bucket holds this dataset in ``fmt`` (with
    ``shard_mb`` MB shards / chunks, else the library's default); returns
    ``{"format", "prefix", "convert_s", "converted_bytes", "original_bytes", "objects"}``.

    Done once per dataset (a marker object records the source signature and what the
    conversion cost): convert the local copy in a subprocess, then upload straight to
    SeaweedFS (``env.direct_endpoint``; not through the link).
    """
    prefix = f"{fmt}{f'-{shard_mb}mb' if shard_mb else ''}/{ds_name}"
    s3 = _s3(env, env.direct_endpoint or env.endpoint)
    marker = f"{prefix}/.bench-source.json"
    sig = json.dumps(manifest["signature"], sort_keys=True)
    with contextlib.suppress(Exception):
        info = json.loads(s3.get_object(Bucket=env.bucket, Key=marker)["Body"].read())
        if info.get("signature") == sig:
            return info["conversion"]
    out = work / f"convert-{prefix.replace('/', '-')}"
    mpath = work / f"manifest-{ds_name}.json"
    mpath.write_text(json.dumps(manifest))
    here = str(Path(__file__).resolve().parents[2])
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bench.systems.peers", "convert", fmt,
                        str(env.data_dir / ds_name), str(mpath), str(out),
                        str(shard_mb or 0)],
                       capture_output=True, text=True, timeout=3600, cwd=here,
                       env=dict(os.environ, PYTHONPATH=here + os.pathsep
                                + os.environ.get("PYTHONPATH", "")))
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
        raise RuntimeError(f"{fmt} conversion failed: {tail[0][:200]}")
    t1 = time.monotonic()
    files = [p for p in out.rglob("*") if p.is_file()]

    def put(p):
        s3.upload_file(str(p), env.bucket, f"{prefix}/{p.relative_to(out)}")
        return p.stat().st_size
    with cf.ThreadPoolExecutor(8) as ex:
        nbytes = sum(ex.map(put, files))
    info = {"format": fmt, "shard_mb": shard_mb, "prefix": prefix,
            "convert_s": round(t1 - t0, 2),
            "upload_s": round(time.monotonic() - t1, 2),
            "converted_bytes": nbytes, "objects": len(files),
            "original_bytes": sum(m["size"] for m in manifest["files"].values()),
            "original_objects": len(manifest["files"])}
    s3.put_object(Bucket=env.bucket, Key=marker,
                  Body=json.dumps({"signature": sig, "conversion": info}).encode())
    shutil.rmtree(out, ignore_errors=True)
    return info


# -- the clients ----------------------------------------------------------------------------
class _Records:
    """A streaming library's sample dict -> the train-files record (picklable)."""

    def __init__(self, manifest: dict):
        self.verify = tf.Verify(manifest)

    def __call__(self, s):
        return self.verify(s["path"], s["jpg"])


class PeerClient:
    """A peer's workloads; subclasses implement the scenarios they run in."""

    def __init__(self, system: "ClientSystem", work: Path):
        self.system = system
        self.env = system.env
        self.tuned = system.tuned
        self.work = work
        self.loaders: dict = {}
        self.aborted = False
        self.conv: dict | None = None

    def abort(self) -> None:
        """Watchdog: kill this process's forked loader workers (a hung read then fails)."""
        self.aborted = True
        me = os.getpid()
        mine = Path(f"/proc/{me}/cmdline").read_bytes()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == me:
                continue
            try:
                ppid = int((d / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
                if ppid == me and (d / "cmdline").read_bytes() == mine:
                    os.kill(int(d.name), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue

    def close(self) -> None:
        for ld in self.loaders.values():
            it = getattr(getattr(ld, "loader", ld), "_iterator", None)
            with contextlib.suppress(Exception):
                if it is not None:
                    it._shutdown_workers()
        self.loaders.clear()

    def uri(self, key: str) -> str:
        return f"s3://{self.env.bucket}/{key}"

    # a loader for file-per-sample datasets: epoch(e) -> iterable of record batches
    def train_loader(self, ds_name: str, manifest: dict, seed: int, batch: int = tf.BATCH):
        raise NotImplementedError

    def prepare(self, ds_name: str, manifest: dict) -> None:
        """One-off work before the clock starts (the streaming libraries' conversion)."""
        fmt = getattr(self, "fmt", None)
        if fmt:
            mb = TUNING[self.system.peer].get("shard_mb") if self.tuned else None
            self.conv = converted(self.env, fmt, ds_name, manifest, self.work, mb)

    def conversion(self) -> dict | None:
        """What the converted copy cost (streaming libraries), once one was made."""
        return self.conv

    def loader(self, ds_name: str, manifest: dict, seed: int, batch: int = tf.BATCH):
        """``train_loader``, built once per dataset and kept for the next epochs."""
        key = (ds_name, batch)
        if key not in self.loaders:
            self.loaders[key] = self.train_loader(ds_name, manifest, seed, batch)
        return self.loaders[key]

    def samples_epoch(self, ds_name: str, manifest: dict, seed: int, epoch: int) -> dict:
        """The samples workload through this peer's loader (one pass over every file;
        the first call is cold, the next one an epoch later)."""
        t0 = time.monotonic()
        ld = self.loader(ds_name, manifest, seed, tf.BATCH)
        r = tf.train_files(ld.epoch, manifest, 0.0, 10 ** 9, epoch, t0=t0)
        return {"seconds": r["seconds"], "bytes": r["bytes"], "files": r["samples"],
                "verify_errors": r["verify_errors"], "value": r["samples"] / r["seconds"],
                "unit": "files/s", "mbps": r["mbps"]}


class S3TorchClient(PeerClient):
    def _cfg(self):
        from s3torchconnector import S3ClientConfig
        return S3ClientConfig(force_path_style=True)

    def _kw(self) -> dict:
        return {"region": self.env.region, "endpoint": self.env.endpoint,
                "s3client_config": self._cfg()}

    def samples_epoch(self, ds_name, manifest, seed, epoch):
        """8 readers (tuned: 32) in threads, each ``S3MapDataset[i].read()`` whole."""
        from s3torchconnector import S3MapDataset
        files = manifest["files"]
        order = shuffled(list(files), seed)
        threads = TUNING["s3torchconnector"]["readers"] if self.tuned else SAMPLE_THREADS
        t0 = time.monotonic()
        ds = S3MapDataset.from_objects([self.uri(f"{ds_name}/{rel}") for rel in order],
                                       **self._kw())

        def one(i):
            data = ds[i].read()
            return len(data), xxhash.xxh3_64_hexdigest(data) == files[order[i]]["xxh3"]
        with cf.ThreadPoolExecutor(threads) as ex:
            res = list(ex.map(one, range(len(order))))
        dt = time.monotonic() - t0
        nbytes = sum(n for n, _ in res)
        return {"seconds": dt, "bytes": nbytes, "files": len(order), "readers": threads,
                "verify_errors": sum(not ok for _, ok in res),
                "value": len(order) / dt, "unit": "files/s", "mbps": nbytes / dt / 1e6}

    def _stream(self, ds_name, manifest, rels) -> tuple[int, int]:
        """Read objects one after another through ``S3IterableDataset`` (1 MiB reads)."""
        from s3torchconnector import S3IterableDataset
        files = manifest["files"]
        ds = S3IterableDataset.from_objects([self.uri(f"{ds_name}/{r}") for r in rels],
                                            **self._kw())
        nbytes = bad = 0
        for rel, reader in zip(rels, ds):
            h = xxhash.xxh3_64()
            n = 0
            while True:
                b = reader.read(READ_CHUNK)
                if not b:
                    break
                h.update(b)
                n += len(b)
            nbytes += n
            bad += (h.hexdigest() != files[rel]["xxh3"]) or n != files[rel]["size"]
        return nbytes, bad

    def shards_epoch(self, ds_name, manifest, seed):
        """The shuffled shards one after another (tuned: 4 readers, each streaming its
        share of the order, as DataLoader workers over ``S3IterableDataset`` would)."""
        order = shuffled(list(manifest["files"]), seed)
        n = TUNING["s3torchconnector"]["shard_readers"] if self.tuned else 1
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(n) as ex:
            res = list(ex.map(lambda w: self._stream(ds_name, manifest, order[w::n]),
                              range(n)))
        dt = time.monotonic() - t0
        nbytes = sum(r[0] for r in res)
        return {"seconds": dt, "bytes": nbytes, "files": len(order), "readers": n,
                "verify_errors": sum(r[1] for r in res), "value": nbytes / dt / 1e6,
                "unit": "MB/s"}

    def checkpoint(self):
        """``S3Checkpoint`` (``.writer(uri)`` for torch.save, ``.reader(uri)`` for
        torch.load) on the proxy, configured like the datasets (checkpoint scenario)."""
        from s3torchconnector import S3Checkpoint
        return S3Checkpoint(**self._kw())

    def bigfile_read(self, ds_name, manifest):
        t0 = time.monotonic()
        nbytes, bad = self._stream(ds_name, manifest, list(manifest["files"]))
        dt = time.monotonic() - t0
        return {"seconds": dt, "bytes": nbytes, "files": 1, "verify_errors": bad,
                "value": nbytes / dt / 1e6, "unit": "MB/s"}

    def train_loader(self, ds_name, manifest, seed, batch=tf.BATCH):
        """``S3MapDataset`` over the original objects with the mounts' sampler."""
        from s3torchconnector import S3MapDataset
        paths = sorted(manifest["files"])
        verify = tf.Verify(manifest)
        skip = len(ds_name) + 1
        ds = S3MapDataset.from_objects([self.uri(f"{ds_name}/{r}") for r in paths],
                                       transform=lambda r: verify(r.key[skip:], r.read()),
                                       **self._kw())
        workers = TUNING["s3torchconnector"]["workers"] if self.tuned else tf.WORKERS
        return tf.MapLoader(ds, seed, workers=workers, batch=batch)


class _StreamingLoader:
    def __init__(self, loader, workers: int):
        self.loader = loader
        self.workers = workers

    def epoch(self, e: int):
        return self.loader       # each iteration is the library's next (reshuffled) epoch


def drop_parent_clients(ds) -> None:
    """Forget the S3 client a mosaic ``StreamingDataset`` made in this process, so that
    each forked DataLoader worker makes its own.

    streaming 0.13 downloads ``index.json`` here, in the constructor, with the stream's
    ``S3Downloader``, which keeps its boto3 client and that client's kept-alive
    connection.  It drops the client when the dataset is pickled (spawn workers) but not
    across fork: every forked worker inherits the one socket and sends its first GET down
    it, so the responses interleave and a worker stores pieces of other shards' bodies as
    its shard.  No hash is checked (the writer records none), so the reader then finds
    garbage offsets ("overflow encountered in scalar subtract", "Relative sample index N
    is not present in the shard.NNNNN.mds file"), and garbled responses cost retries
    (extra link bytes).  Nothing in this process downloads after the constructor, so
    clearing the client once here covers every worker.
    """
    for stream in getattr(ds, "streams", None) or ():
        dl = getattr(stream, "_downloader", None)
        if dl is not None:
            dl.clean_up()


class MosaicClient(PeerClient):
    fmt = "mds"

    def train_loader(self, ds_name, manifest, seed, batch=tf.BATCH):
        from torch.utils.data import DataLoader
        sb = import_streaming()
        self.prepare(ds_name, manifest) if self.conv is None else None
        records = _Records(manifest)

        class Verified(sb.StreamingDataset):
            def __getitem__(self, i):
                return records(super().__getitem__(i))

        kw = {}
        if self.tuned:
            kw["predownload"] = TUNING["mosaic"]["predownload_batches"] * batch
        ds = Verified(remote=self.uri(self.conv["prefix"]),
                      local=str(self.work / "cache" / ds_name), shuffle=True,
                      shuffle_seed=seed, batch_size=batch, **kw)
        drop_parent_clients(ds)
        workers = TUNING["mosaic"]["workers"] if self.tuned else tf.WORKERS
        return _StreamingLoader(DataLoader(ds, batch_size=batch, num_workers=workers,
                                           persistent_workers=True, prefetch_factor=2,
                                           collate_fn=tf.records), workers)

    def close(self):
        super().close()
        with contextlib.suppress(Exception):
            import_streaming().util.clean_stale_shared_memory()


class LitDataClient(PeerClient):
    fmt = "litdata"

    def train_loader(self, ds_name, manifest, seed, batch=tf.BATCH):
        import litdata
        self.prepare(ds_name, manifest) if self.conv is None else None
        kw = {"max_pre_download": TUNING["litdata"]["max_pre_download"]} if self.tuned else {}
        ds = litdata.StreamingDataset(self.uri(self.conv["prefix"]),
                                      cache_dir=str(self.work / "cache" / ds_name),
                                      shuffle=True, seed=seed, transform=_Records(manifest),
                                      **kw)
        workers = TUNING["litdata"]["workers"] if self.tuned else tf.WORKERS
        return _StreamingLoader(litdata.StreamingDataLoader(
            ds, batch_size=batch, num_workers=workers, collate_fn=tf.records), workers)


CLIENTS = {"s3torchconnector": S3TorchClient, "mosaic": MosaicClient, "litdata": LitDataClient}


class ClientSystem(System):
    """A peer library as a benchmark system (``kind == "client"``)."""

    kind = "client"

    def __init__(self, env: SystemEnv, name: str):
        super().__init__(env)
        self.name = name
        self.tuned = name.endswith("-tuned")
        self.peer = base(name)

    def check(self):
        why = missing(self.name)
        if why:
            raise SystemUnavailable(why)

    def _env(self) -> dict:
        e = {"AWS_ACCESS_KEY_ID": self.env.access_key,
             "AWS_SECRET_ACCESS_KEY": self.env.secret_key,
             "AWS_DEFAULT_REGION": self.env.region, "AWS_REGION": self.env.region}
        if self.peer == "mosaic":
            e["S3_ENDPOINT_URL"] = self.env.endpoint
        if self.peer == "litdata":
            e["AWS_ENDPOINT_URL"] = self.env.endpoint
            e["DISABLE_S5CMD"] = "1"
        return e

    @contextlib.contextmanager
    def open(self, opts: MountOptions | None = None):
        self.check()
        # The library's import (s3torchconnector's pulls in torch: seconds) is its
        # start-up, as a mount's is: not in the first row that uses it.
        import_peer(self.peer)
        t0 = time.monotonic()
        work = self.env.work_dir / self.name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        saved = {k: os.environ.get(k) for k in self._env()}
        os.environ.update(self._env())
        patched = None
        if self.peer == "litdata":
            # LitData fetches chunks with obstore, which refuses plain-HTTP endpoints
            # unless told; the benchmark link is plain HTTP (a real S3 endpoint is HTTPS).
            import litdata.streaming.downloader as dl
            patched = dl._OBSTORE_CLIENT_OPTIONS
            dl._OBSTORE_CLIENT_OPTIONS = {**patched, "allow_http": True}
        tf.quiet_torch_warnings()    # "8 workers on 2 cores": known, and the point
        client = CLIENTS[self.peer](self, work)
        try:
            yield Mounted(self.name, None, remote=True, kind="client", client=client,
                          info={"mount_s": time.monotonic() - t0, "kind": "client",
                                "tuned": TUNING[self.peer] if self.tuned else "defaults",
                                "version": _version(self.peer)})
        finally:
            client.close()
            if patched is not None:
                import litdata.streaming.downloader as dl
                dl._OBSTORE_CLIENT_OPTIONS = patched
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(work, ignore_errors=True)


def _version(peer: str) -> str | None:
    import importlib.metadata as md
    with contextlib.suppress(Exception):
        return md.version(PEERS[peer][1])
    return None


if __name__ == "__main__":
    if sys.argv[1:2] != ["convert"] or len(sys.argv) not in (6, 7):
        print("usage: python -m bench.systems.peers convert mds|litdata SRC MANIFEST OUT "
              "[SHARD_MB]",
              file=sys.stderr)
        sys.exit(2)
    fmt, src, man, out = sys.argv[2:6]
    convert(fmt, Path(src), json.loads(Path(man).read_text()), Path(out),
            int(sys.argv[6]) if len(sys.argv) == 7 and int(sys.argv[6]) else None)
