#!/usr/bin/env python3
"""The library's public surface, read from rustdoc JSON: every item other than a
module that can be reached from the crate root through public modules and
re-exports, with the paths that reach it, and the count of items reachable by
two or more paths.

    RUSTC_BOOTSTRAP=1 cargo rustdoc -p weightmap --lib --no-default-features -- \
        -Z unstable-options --output-format json
    python3 .ci/public-surface.py target/doc/weightmap.json [-v]

A maintainer's tool (rustdoc JSON is unstable, so CI does not run it).
"""
import json, sys, collections
doc = json.load(open(sys.argv[1]))
index = doc["index"]; paths = doc["paths"]
reach = collections.defaultdict(set)   # item id -> set of paths
modpaths = set()
def kind_of(item):
    return next(iter(item["inner"]))
def walk(mid, prefix, seen):
    if mid in seen: return
    seen = seen | {mid}
    modpaths.add(prefix)
    m = index[str(mid)]
    for cid in m["inner"]["module"]["items"]:
        c = index.get(str(cid))
        if c is None or c.get("visibility") != "public": continue
        k = kind_of(c)
        if k == "use":
            u = c["inner"]["use"]
            tid = u.get("id")
            name = u["name"]
            if u.get("is_glob"):
                t = index.get(str(tid))
                if t and kind_of(t) == "module":
                    # glob: walk the target's items under this prefix
                    for gid in t["inner"]["module"]["items"]:
                        g = index.get(str(gid))
                        if g and g.get("visibility") == "public" and kind_of(g) != "use":
                            if kind_of(g) == "module": walk(gid, prefix + "::" + g["name"], seen)
                            else: reach[gid].add(prefix + "::" + g["name"])
                continue
            t = index.get(str(tid)) if tid is not None else None
            if t is not None and kind_of(t) == "module":
                walk(tid, prefix + "::" + name, seen)
            else:
                key = tid if tid is not None else ("ext", u["source"])
                if t is None and tid is not None and str(tid) in paths:
                    key = ("ext", "::".join(paths[str(tid)]["path"]))
                reach[key].add(prefix + "::" + name)
        elif k == "module":
            walk(cid, prefix + "::" + c["name"], seen)
        else:
            reach[cid].add(prefix + "::" + c["name"])
root = doc["root"]
walk(root, index[str(root)]["name"], frozenset())
multi = {k: v for k, v in reach.items() if len(v) > 1}
methods = 0
for k in reach:
    it = index.get(str(k)) if not isinstance(k, tuple) else None
    if not it: continue
    kk = kind_of(it)
    if kk in ("struct", "enum", "union"):
        for iid in it["inner"][kk].get("impls", []):
            imp = index[str(iid)]["inner"]["impl"]
            if imp.get("trait") is None:
                for mid in imp["items"]:
                    mm = index[str(mid)]
                    if mm.get("visibility") == "public" and kind_of(mm) == "function": methods += 1
print(f"items: {len(reach)}  module paths: {len(modpaths)}  inherent methods: {methods}  reachable by 2+ paths: {len(multi)}")
if "-v" in sys.argv:
    for k, v in sorted(reach.items(), key=lambda kv: sorted(kv[1])[0]):
        print("  ", " | ".join(sorted(v)))
