"""Keeps deploy/grafana/tutti.json honest: it is a well-formed Grafana dashboard, and every metric
family, label name and label value its queries use is one tuttid really serves.

The families come from a real tuttid (host mode, a small pool in a temporary directory, metrics on
127.0.0.1:0), scraped once: every family's "# TYPE" line is on the page even when it has no
samples, so a renamed or removed family fails here. Label names and values are checked against
the samples of that scrape. Some families have no samples in such a daemon (the tutti_nvme_* ones
until `tuttictl devices --report` sends a report, which needs root and an NVMe device; the
tutti_namespace_* ones without namespaces): for those, label names are checked against the label
names of every family of the daemon's stats registry (common/stats.h), as the same tuttid lists
them (`tuttictl stats --json`, "metrics", samples or not), and label values not at all. Where
promtool is installed (Debian's prometheus package) it parses every query as well.

    bazel test //deploy:grafana_dashboard_test
    python3 deploy/grafana/dashboard_test.py     # from the repository root, after
                                                 # bazel build //daemon:tuttid //client:tuttictl
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.request

# Labels Prometheus adds to every series it scrapes.
TARGET_LABELS = {"instance", "job"}
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")

NAME_RE = re.compile(r"\btutti_[a-z0-9_]+")
SELECTOR_RE = re.compile(r"\b(tutti_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
GROUPING_RE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LEGEND_RE = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
SAMPLE_RE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+")
INSTANCE_MATCHER = 'instance=~"$instance"'


def repo_file(rel):
    """`rel` in the test's runfiles, else in the checkout this file is in."""
    root = os.environ.get("TEST_SRCDIR")
    if root and os.path.exists(os.path.join(root, "tutti", rel)):
        return os.path.join(root, "tutti", rel)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", rel)


def find_promtool():
    """promtool's path (Debian's prometheus package), or None."""
    return shutil.which("promtool", path=os.environ.get("PATH", "") + ":/usr/bin:/usr/local/bin")


def find_tuttid():
    if os.environ.get("TUTTID_BIN"):
        return os.environ["TUTTID_BIN"]
    path = repo_file("daemon/tuttid")
    if os.access(path, os.X_OK):
        return path
    return repo_file("bazel-bin/daemon/tuttid")


def find_tuttictl():
    if os.environ.get("TUTTICTL_BIN"):
        return os.environ["TUTTICTL_BIN"]
    path = repo_file("client/tuttictl")
    if os.access(path, os.X_OK):
        return path
    return repo_file("bazel-bin/client/tuttictl")


# ---------------------------------------------------------------------------- the served families

class Served:
    """The families of one /metrics page: their types, and the label names and values their
    samples carry."""

    def __init__(self, page, source_labels):
        self.types = {}   # family -> "counter", "gauge", "histogram", ...
        self.labels = {}  # family -> {label name -> set of values}, families with samples only
        # The registry's label names: the fallback for families without samples.
        self.source_labels = set(source_labels)
        for line in page.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(None, 3)
                self.types[name] = kind.strip()
        for line in page.splitlines():
            if not line or line.startswith("#"):
                continue
            m = SAMPLE_RE.match(line)
            if not m:
                continue
            family, _ = self.resolve(m.group(1))
            if family is None:
                continue
            seen = self.labels.setdefault(family, {})
            for name, _, value in MATCHER_RE.findall(m.group(2) or ""):
                seen.setdefault(name, set()).add(value)

    def resolve(self, name):
        """(family, problem): the family a series name belongs to (a histogram's _bucket, _count
        and _sum series to the histogram), or None and why not."""
        kind = self.types.get(name)
        if kind in ("histogram", "summary"):
            return None, "%s is a %s: query its _bucket, _count or _sum series" % (name, kind)
        if kind is not None:
            return name, None
        for suffix in HISTOGRAM_SUFFIXES:
            base = name[:-len(suffix)]
            if name.endswith(suffix) and self.types.get(base) in ("histogram", "summary"):
                return base, None
        return None, "%s is not served by tuttid" % name

    def label_names(self, family):
        """The label names `family` may carry; the registry's label names for one without
        samples."""
        if family in self.labels:
            return set(self.labels[family])
        return set(self.source_labels)


def registry_label_names(stats):
    """The label names of every family in `tuttictl stats --json`'s "metrics" (the stats
    registry's families, those without samples included)."""
    return {name for family in stats.get("metrics", []) for name in family["label_names"]}


# ---------------------------------------------------------------------------- the dashboard

def all_panels(dashboard):
    """Every panel, the ones inside collapsed rows included."""
    for p in dashboard.get("panels", []):
        yield p
        for inner in p.get("panels", []) or []:
            yield inner


def queries(dashboard):
    """(where, expr, legend) of every query: the panels' targets and the query variables'."""
    for p in all_panels(dashboard):
        for t in p.get("targets", []) or []:
            yield ("panel %s %r target %s" % (p.get("id"), p.get("title"), t.get("refId")),
                   t.get("expr", ""), t.get("legendFormat", ""))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            yield ("variable %s" % v.get("name"), q.get("query", "") if isinstance(q, dict) else q,
                   "")


def shape_problems(dashboard):
    """Why `dashboard` is not a dashboard Grafana imports with working panels ([] if it is)."""
    bad = []
    for key in ("title", "uid", "schemaVersion", "panels", "templating"):
        if key not in dashboard:
            bad.append("no %r" % key)
    if not isinstance(dashboard.get("schemaVersion"), int) or dashboard["schemaVersion"] < 36:
        bad.append("schemaVersion %r: want an int >= 36 (Grafana 9+)"
                   % dashboard.get("schemaVersion"))
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        bad.append("no variable 'datasource' of type datasource, query prometheus")
    inst = variables.get("instance", {})
    inst_query = inst.get("query")
    inst_query = inst_query.get("query") if isinstance(inst_query, dict) else inst_query
    if inst.get("type") != "query" or inst_query != "label_values(tutti_sessions, instance)":
        bad.append("no variable 'instance' querying label_values(tutti_sessions, instance)")
    ids = {}
    boxes = []
    panels = list(all_panels(dashboard))
    if not [p for p in panels if p.get("type") != "row"]:
        bad.append("no panels")
    for p in panels:
        pid = p.get("id")
        name = "panel %s %r" % (pid, p.get("title"))
        if not isinstance(pid, int):
            bad.append("%s: id is not an int" % name)
        elif pid in ids:
            bad.append("%s: id also used by %r" % (name, ids[pid]))
        else:
            ids[pid] = p.get("title")
        if not p.get("title"):
            bad.append("%s: no title" % name)
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")):
            bad.append("%s: gridPos needs int x, y, w, h" % name)
        elif g["x"] < 0 or g["w"] < 1 or g["x"] + g["w"] > 24 or g["h"] < 1:
            bad.append("%s: gridPos %r outside the 24 columns" % (name, g))
        else:
            for other, og in boxes:
                if (g["x"] < og["x"] + og["w"] and og["x"] < g["x"] + g["w"] and
                        g["y"] < og["y"] + og["h"] and og["y"] < g["y"] + g["h"]):
                    bad.append("%s overlaps %s" % (name, other))
            boxes.append((name, g))
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            bad.append("%s: datasource is not ${datasource}" % name)
        targets = p.get("targets") or []
        if not targets:
            bad.append("%s: no targets" % name)
        refs = set()
        for t in targets:
            if not isinstance(t.get("expr"), str) or not t["expr"].strip():
                bad.append("%s target %s: no expr" % (name, t.get("refId")))
            if t.get("refId") in refs or not t.get("refId"):
                bad.append("%s: refId %r missing or repeated" % (name, t.get("refId")))
            refs.add(t.get("refId"))
            if t.get("datasource", {}).get("uid") != "${datasource}":
                bad.append("%s target %s: datasource is not ${datasource}"
                           % (name, t.get("refId")))
    return bad


def metric_problems(dashboard, served):
    """Why the queries of `dashboard` would not find tuttid's series ([] if they would): unknown
    family names, label names the family does not carry, = matcher values it never shows, and
    panel selectors without the instance variable."""
    bad = []
    for where, expr, legend in queries(dashboard):
        families = set()
        for name in NAME_RE.findall(expr):
            family, why = served.resolve(name)
            if family is None:
                bad.append("%s: %s" % (where, why))
            else:
                families.add(family)
        allowed = set(TARGET_LABELS)
        for f in families:
            allowed |= served.label_names(f)
        for name, matchers in SELECTOR_RE.findall(expr):
            family, _ = served.resolve(name)
            if family is None:
                continue
            for label, op, value in MATCHER_RE.findall(matchers):
                if label in TARGET_LABELS:
                    continue
                if label not in served.label_names(family):
                    bad.append("%s: %s has no label %r" % (where, family, label))
                elif op == "=" and family in served.labels and \
                        value not in served.labels[family].get(label, set()):
                    bad.append("%s: %s{%s} is never %r (tuttid shows %s)"
                               % (where, family, label, value,
                                  sorted(served.labels[family].get(label, set()))))
        if not where.startswith("variable"):
            for m in NAME_RE.finditer(expr):
                rest = expr[m.end():]
                if not rest.startswith("{") or INSTANCE_MATCHER not in rest[:rest.find("}")]:
                    bad.append("%s: %s without %s" % (where, m.group(0), INSTANCE_MATCHER))
        used = set()
        for group in GROUPING_RE.findall(expr):
            used |= {l.strip() for l in group.split(",") if l.strip()}
        used |= {m.group(1) for m in re.finditer(r"label_values\([^,]*,\s*(\w+)\s*\)", expr)}
        used |= set(LEGEND_RE.findall(legend))
        for label in sorted(used - allowed):
            bad.append("%s: label %r is on none of %s" % (where, label, sorted(families)))
    return bad


# ---------------------------------------------------------------------------- the daemon

def scrape_tuttid(timeout=60.0):
    """Starts tuttid (tutti.testing's, host mode) with metrics on a free port, returns its
    /metrics page and its `tuttictl stats --json` (parsed), and stops it."""
    from tutti.testing import Tuttid
    with Tuttid(binary=find_tuttid(), capacity=64 << 20, object_bytes=4096, max_objects=8,
                dram=8 << 20, store_staging=16 << 20, retrieve_staging=16 << 20,
                metrics_listen="127.0.0.1:0") as daemon:
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(r"metrics on (http://127\.0\.0\.1:[0-9]+/metrics)", daemon.log_tail())
            if m:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("tuttid logged no metrics address within %.0f s:\n%s"
                                   % (timeout, daemon.log_tail()))
            time.sleep(0.05)
        with urllib.request.urlopen(m.group(1), timeout=30) as r:
            page = r.read().decode()
        ctl = subprocess.run([find_tuttictl(), "stats", "--json", "--socket", daemon.socket],
                             capture_output=True, text=True, timeout=30)
        if ctl.returncode != 0:
            raise RuntimeError("tuttictl stats --json failed: %s" % ctl.stderr)
        return page, json.loads(ctl.stdout)


# ---------------------------------------------------------------------------- the tests

class DashboardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(repo_file("deploy/grafana/tutti.json")) as f:
            cls.dashboard = json.load(f)
        page, stats = scrape_tuttid()
        cls.served = Served(page, registry_label_names(stats))

    def test_is_a_dashboard(self):
        self.assertEqual(shape_problems(self.dashboard), [])

    def test_the_scrape_is_tuttids(self):
        # Guards the checks below against an empty or foreign page.
        self.assertIn("tutti_sessions", self.served.types)
        self.assertEqual(self.served.types.get("tutti_io_latency_seconds"), "histogram")
        self.assertGreater(len([f for f in self.served.types if f.startswith("tutti_")]), 50)
        for key in ("tier", "op", "device", "serial", "kind", "advised"):
            self.assertIn(key, self.served.source_labels)

    def test_queries_use_only_what_tuttid_serves(self):
        problems = metric_problems(self.dashboard, self.served)
        self.assertEqual(problems, [], "\n".join(problems))
        used = set()
        for _, expr, _ in queries(self.dashboard):
            used |= {self.served.resolve(n)[0] for n in NAME_RE.findall(expr)}
        self.assertGreater(len(used), 40)
        unused = sorted(f for f in self.served.types if f.startswith("tutti_") and f not in used)
        if unused:
            print("families served but on no panel: " + ", ".join(unused))

    def test_promtool_parses_every_query(self):
        # Each query as a recording rule, Grafana's variables replaced by values, through
        # `promtool check rules` (which parses every expr).
        promtool = find_promtool()
        if promtool is None:
            self.skipTest("promtool not found (Debian package prometheus): queries not parsed")
        rules = []
        for n, (where, expr, _) in enumerate(queries(self.dashboard)):
            if where.startswith("variable"):
                continue  # label_values() is Grafana's, not PromQL
            expr = expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
            rules.append("      - record: dashboard_query_%d  # %s\n        expr: %s"
                         % (n, where, json.dumps(expr.replace("$instance", ".*"))))
        with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=os.environ.get("TEST_TMPDIR"),
                                         delete=False) as f:
            f.write("groups:\n  - name: dashboard\n    rules:\n" + "\n".join(rules) + "\n")
        try:
            r = subprocess.run([promtool, "check", "rules", f.name], capture_output=True,
                               text=True)
        finally:
            os.unlink(f.name)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_the_checks_catch_a_rename(self):
        # The checker itself: a renamed family, label name or label value, or a label a family
        # does not have, each makes it complain.
        text = json.dumps(self.dashboard)
        for old, new in (("tutti_lookup_hits_total", "tutti_lookup_hit_total"),
                         ("tutti_io_latency_seconds_bucket", "tutti_io_latency_seconds"),
                         ('tier=\\"dram\\"', 'tier=\\"DRAM\\"'),
                         ('op=\\"read\\"', 'kind=\\"read\\"'),
                         ("instance, op) (rate(tutti_io_bytes_total",
                          "instance, device) (rate(tutti_io_bytes_total"),
                         ("{{instance}} {{device}} {{serial}}", "{{instance}} {{drive}}")):
            self.assertIn(old, text)
            renamed = json.loads(text.replace(old, new))
            self.assertNotEqual(metric_problems(renamed, self.served), [], "%s -> %s" % (old, new))


if __name__ == "__main__":
    unittest.main()
