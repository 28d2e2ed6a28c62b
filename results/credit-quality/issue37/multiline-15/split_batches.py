"""Cut a sample+segment run into batches of 2 prompt groups, each a run folder of its own with
its manifests' hashes updated: python split_batches.py SRC PREFIX BATCHES (used by commands.sh and
rejudge-packed/go.sh; prints each batch's samples and segments sha256)."""
import hashlib, json, os, shutil, sys
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
src, prefix, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = pq.read_table(f"{src}/sample/samples.parquet"); g = pq.read_table(f"{src}/segment/segments.parquet")
prompts = list(dict.fromkeys(s.column("prompt_id").to_pylist()))
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
for b in range(batches):
    d = f"{prefix}{b + 1}"; shutil.rmtree(d, ignore_errors=True)
    for stage, table, name in (("sample", s, "samples.parquet"), ("segment", g, "segments.parquet")):
        os.makedirs(f"{d}/{stage}")
        for f in ("config.yaml", "manifest.json", "overrides.yaml"):
            shutil.copy(f"{src}/{stage}/{f}", f"{d}/{stage}/{f}")
        pq.write_table(table.filter(pc.is_in(table.column("prompt_id"), value_set=pa.array(prompts[2 * b:2 * b + 2]))), f"{d}/{stage}/{name}")
    m = json.load(open(f"{d}/sample/manifest.json")); m["outputs"]["samples"]["sha256"] = sha(f"{d}/sample/samples.parquet")
    json.dump(m, open(f"{d}/sample/manifest.json", "w"), indent=2)
    m = json.load(open(f"{d}/segment/manifest.json")); m["inputs"]["samples"].update(path=f"{d}/sample/samples.parquet", sha256=sha(f"{d}/sample/samples.parquet"))
    m["outputs"]["segments"]["sha256"] = sha(f"{d}/segment/segments.parquet"); json.dump(m, open(f"{d}/segment/manifest.json", "w"), indent=2)
    print(d, sha(f"{d}/sample/samples.parquet"), sha(f"{d}/segment/segments.parquet"))
