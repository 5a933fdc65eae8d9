"""Keeps deploy/prometheus/tutti-alerts.yml honest: promtool accepts it (`promtool check rules`),
its unit tests pass (`promtool test rules tutti-alerts_test.yml`), every alert has a test case
where it fires and one where it must not, and every family, label name and label value the rules
use is one tuttid really serves.

The served families come from a real tuttid, scraped once, as in deploy/grafana/dashboard_test.py
(whose checker this reuses): a renamed family, label or label value fails here rather than leaving
an alert that can never fire. `up` is the one series allowed that tuttid does not serve
(Prometheus writes it for every scrape).

promtool (Debian's prometheus, deploy/debian-packages.txt) is required: without it the promtool
cases fail, as tools/thread_safety.sh and tools/python_check.sh fail without their tools, rather
than skip and count as passed.

    bazel test //deploy:prometheus_rules_test
    python3 deploy/prometheus/rules_test.py     # from the repository root, after
                                                # bazel build //daemon:tuttid
"""

import os
import re
import subprocess
import sys
import unittest


def _repo_file(rel):
    root = os.environ.get("TEST_SRCDIR")
    if root and os.path.exists(os.path.join(root, "tutti", rel)):
        return os.path.join(root, "tutti", rel)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", rel)


sys.path.insert(0, os.path.dirname(_repo_file("deploy/grafana/dashboard_test.py")))
import dashboard_test as served_check  # noqa: E402  (Served, scrape_tuttid, the regexes)

RULES = "deploy/prometheus/tutti-alerts.yml"
TESTS = "deploy/prometheus/tutti-alerts_test.yml"
# Series Prometheus writes itself, allowed in rules though tuttid does not serve them.
PROMETHEUS_SERIES = {"up"}
TEMPLATE_LABEL_RE = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")
PLAIN_ALTERNATIVES_RE = re.compile(r"[a-zA-Z0-9_]+(\|[a-zA-Z0-9_]+)*")


# ---------------------------------------------------------------------------- reading the files
# Without a YAML library (none is in deploy/debian-packages.txt): the rules file's own shape, a
# list of "- alert:" items whose "expr:" is one line or a block scalar ("|", ">", ">-"). promtool's
# rule count is compared with what this finds, so a rule it misses fails the test.

def parse_rules(text):
    """[{"alert", "expr", "text"}] of the rules file: each alerting rule, its expression, and all
    its lines (for the $labels its templates use)."""
    rules = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"(\s*)- alert:\s*(\S+)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        rule = {"alert": m.group(2), "expr": None, "text": lines[i]}
        i += 1
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" " * (indent + 1))
                                  and not re.match(r"\s*- (alert|record):", lines[i])):
            line = lines[i]
            rule["text"] += "\n" + line
            e = re.match(r"(\s*)expr:\s*(.*)$", line)
            if e and rule["expr"] is None:
                value = e.group(2).strip()
                if value in ("|", "|-", ">", ">-"):
                    body = []
                    key_indent = len(e.group(1))
                    while i + 1 < len(lines) and (not lines[i + 1].strip() or
                                                  len(lines[i + 1]) - len(lines[i + 1].lstrip())
                                                  > key_indent):
                        i += 1
                        rule["text"] += "\n" + lines[i]
                        body.append(lines[i].strip())
                    value = " ".join(b for b in body if b)
                rule["expr"] = value
            i += 1
        rules.append(rule)
    return rules


def parse_test_cases(text):
    """[(alertname, fires)] of the promtool test file: each alert_rule_test case and whether it
    expects alerts (exp_alerts with items) or none (exp_alerts: [])."""
    cases = []
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*alertname:\s*(\S+)\s*$", line)
        if m:
            name = m.group(1)
            continue
        m = re.match(r"\s*exp_alerts:\s*(\S*)\s*$", line)
        if m and name is not None:
            cases.append((name, m.group(1) != "[]"))
            name = None
    return cases


def test_series(text):
    """The input_series selectors of the promtool test file (a selector may span lines)."""
    return [" ".join(s.split()) for s in re.findall(r"- series:\s*'([^']*)'", text)]


# ---------------------------------------------------------------------------- the checks

def rule_problems(rules, served):
    """Why `rules` would not match tuttid's series ([] if they would): unknown families, label
    names a family does not carry, = and =~ (plain alternatives) values it never shows, and
    $labels in templates that the expression's result cannot have."""
    bad = []
    for rule in rules:
        where = "alert %s" % rule["alert"]
        expr = rule["expr"] or ""
        if not expr:
            bad.append("%s: no expr" % where)
            continue
        families = set()
        for name in served_check.NAME_RE.findall(expr):
            family, why = served.resolve(name)
            if family is None:
                bad.append("%s: %s" % (where, why))
            else:
                families.add(family)
        for name in re.findall(r"\b([a-z_]+)\s*\{", expr):
            if not name.startswith("tutti_") and name not in PROMETHEUS_SERIES:
                bad.append("%s: %s is neither tuttid's nor Prometheus' own" % (where, name))
        allowed = set(served_check.TARGET_LABELS)
        for f in families:
            allowed |= served.label_names(f)
        for name, matchers in served_check.SELECTOR_RE.findall(expr):
            family, _ = served.resolve(name)
            if family is None:
                continue
            for label, op, value in served_check.MATCHER_RE.findall(matchers):
                if label in served_check.TARGET_LABELS:
                    continue
                if label not in served.label_names(family):
                    bad.append("%s: %s has no label %r" % (where, family, label))
                    continue
                if family not in served.labels:
                    continue  # no samples to compare values with (tutti_nvme_*)
                shown = served.labels[family].get(label, set())
                values = []
                if op == "=":
                    values = [value]
                elif op == "=~" and PLAIN_ALTERNATIVES_RE.fullmatch(value):
                    values = value.split("|")
                for v in values:
                    if v not in shown:
                        bad.append("%s: %s{%s} is never %r (tuttid shows %s)"
                                   % (where, family, label, v, sorted(shown)))
        used = set()
        for group in served_check.GROUPING_RE.findall(expr):
            used |= {l.strip() for l in group.split(",") if l.strip()}
        used |= set(TEMPLATE_LABEL_RE.findall(rule["text"]))
        for label in sorted(used - allowed):
            bad.append("%s: label %r is on none of %s" % (where, label, sorted(families)))
    return bad


def series_problems(selectors, served):
    """Why the promtool test's input series are not tuttid's ([] if they are): unknown families and
    label names they do not carry (values are made up for the cases, so not compared)."""
    bad = []
    for sel in selectors:
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$", sel)
        if not m:
            bad.append("input series %r: not a selector" % sel)
            continue
        if m.group(1) in PROMETHEUS_SERIES:
            continue
        family, why = served.resolve(m.group(1))
        if family is None:
            bad.append("input series %s: %s" % (sel, why))
            continue
        for label, _, _ in served_check.MATCHER_RE.findall(m.group(2) or ""):
            if label not in served_check.TARGET_LABELS and label not in served.label_names(family):
                bad.append("input series %s: %s has no label %r" % (sel, family, label))
    return bad


def run_promtool(*args):
    promtool = served_check.find_promtool()
    if promtool is None:
        raise AssertionError("promtool is missing (Debian package prometheus; "
                             "tools/install-deps.sh installs it)")
    return subprocess.run([promtool] + list(args), capture_output=True, text=True)


# ---------------------------------------------------------------------------- the tests

class RulesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(_repo_file(RULES)) as f:
            cls.rules_text = f.read()
        with open(_repo_file(TESTS)) as f:
            cls.tests_text = f.read()
        cls.rules = parse_rules(cls.rules_text)

    def test_promtool_checks_rules(self):
        r = run_promtool("check", "rules", _repo_file(RULES))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # Every rule promtool found is one parse_rules found, so the checks below see them all.
        m = re.search(r"SUCCESS: (\d+) rules found", r.stdout + r.stderr)
        self.assertIsNotNone(m, r.stdout + r.stderr)
        self.assertEqual(int(m.group(1)), len(self.rules), [x["alert"] for x in self.rules])

    def test_promtool_test_rules(self):
        # rule_files in the test file is relative to it: both are in deploy/prometheus/.
        r = run_promtool("test", "rules", _repo_file(TESTS))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_each_alert_fires_and_stays_quiet_in_a_case(self):
        names = [x["alert"] for x in self.rules]
        self.assertEqual(len(names), len(set(names)), "alert names repeated")
        self.assertGreaterEqual(len(names), 5)
        cases = parse_test_cases(self.tests_text)
        for name in names:
            self.assertIn((name, True), cases, "%s: no case where it fires" % name)
            self.assertIn((name, False), cases, "%s: no case where it must not fire" % name)
        unknown = sorted({n for n, _ in cases} - set(names))
        self.assertEqual(unknown, [], "test cases for alerts the rules do not have")

    def test_every_rule_has_severity_and_words(self):
        for rule in self.rules:
            for key in ("severity:", "summary:", "description:"):
                self.assertIn(key, rule["text"], "%s: no %s" % (rule["alert"], key))


class ServedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(_repo_file(RULES)) as f:
            cls.rules_text = f.read()
        with open(_repo_file(TESTS)) as f:
            cls.tests_text = f.read()
        page, stats = served_check.scrape_tuttid()
        cls.served = served_check.Served(page, served_check.registry_label_names(stats))

    def test_the_scrape_is_tuttids(self):
        self.assertIn("tutti_errors_total", self.served.types)
        self.assertIn("verify", self.served.labels["tutti_errors_total"]["kind"])

    def test_rules_use_only_what_tuttid_serves(self):
        problems = rule_problems(parse_rules(self.rules_text), self.served)
        self.assertEqual(problems, [], "\n".join(problems))

    def test_test_series_are_tuttids(self):
        selectors = test_series(self.tests_text)
        self.assertGreater(len(selectors), 20)
        problems = series_problems(selectors, self.served)
        self.assertEqual(problems, [], "\n".join(problems))

    def test_the_checks_catch_a_rename(self):
        # The checker itself: a renamed family, label name, label value or template label each
        # makes it complain.
        for old, new in (("tutti_durability_lost", "tutti_durability_lost_total"),
                         ('kind="verify"', 'kind="verification"'),
                         ('kind=~"io|store_failed|checkpoint"', 'kind=~"io|store_fail|checkpoint"'),
                         ('reason!=""', 'why!=""'),
                         ("$labels.serial", "$labels.drive"),
                         ('up{job="tutti"}', 'tuttid_up{job="tutti"}')):
            self.assertIn(old, self.rules_text)
            renamed = parse_rules(self.rules_text.replace(old, new))
            self.assertNotEqual(rule_problems(renamed, self.served), [], "%s -> %s" % (old, new))
        self.assertNotEqual(series_problems(['tutti_errors_total{type="io", instance="a"}'],
                                            self.served), [])


if __name__ == "__main__":
    unittest.main()
