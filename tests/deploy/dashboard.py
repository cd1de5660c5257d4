"""Checks a Grafana dashboard's queries against a real host's /metrics:
every metric a query names is one the host exposes, with every label the
query selects or groups by on its samples. Exits 1 naming every problem.

    python3 tests/deploy/dashboard.py deploy/grafana/corral.json SCRAPE...
"""

import json
import re
import sys

# PromQL words that are not metric names.
FUNCTIONS = {
    "sum", "max", "min", "avg", "count", "rate", "irate", "increase",
    "histogram_quantile", "by", "without", "on", "ignoring", "label_values",
}


def exposed(scrapes):
    """Metric name -> the label names seen on its samples (a family with
    only its `# TYPE` line has no samples, and so no labels)."""
    families = {}
    for text in scrapes:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                families.setdefault(line.split()[2], set())
            elif line and not line.startswith("#"):
                m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
                if m:
                    labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
                    # A histogram's series are its family's.
                    families.setdefault(base(m.group(1), families), set()).update(labels)
    return families


def base(name, families):
    """The family a histogram's series belong to."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return name


def queries(dashboard):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            yield f"variable {var['name']}", var["query"]


def main(dashboard_path, scrape_paths):
    dashboard = json.load(open(dashboard_path))
    families = exposed(open(p).read() for p in scrape_paths)
    problems = []
    checked = 0
    for title, expr in queries(dashboard):
        # Grafana's own variables are not PromQL.
        text = re.sub(r"\$\{?\w+\}?", "x", expr)
        groups = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", text)
        text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
        # Selectors: a metric and its label matchers.
        for name, matchers in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", text):
            check(title, name, re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers), families, problems)
            checked += 1
        # Bare metrics: in a function's parentheses, without matchers.
        for name in re.findall(r"\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[,\[)]", text):
            if name not in FUNCTIONS and not name.isdigit():
                check(title, name, [], families, problems)
                checked += 1
        # Grouping: each label must be on the metrics the query reads.
        names = [n for n in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[\{\[]", text) if n not in FUNCTIONS]
        for group in groups:
            labels = [l.strip() for l in group.split(",") if l.strip() and l.strip() != "le"]
            for name in names:
                check(title, name, labels, families, problems)
    if checked == 0:
        problems.append("no query named a metric: the parser found nothing to check")
    problems = list(dict.fromkeys(problems))
    for p in problems:
        print(p, file=sys.stderr)
    print(f"{checked} selectors checked against {len(families)} metric families")
    sys.exit(1 if problems else 0)


def check(title, name, labels, families, problems):
    family = base(name, families)
    if family not in families:
        problems.append(f"{title}: `{name}` is not in the host's /metrics")
        return
    seen = families[family]
    for label in labels:
        if label == "le" and name.endswith("_bucket"):
            continue
        if label not in seen:
            problems.append(f"{title}: `{name}` has no label `{label}` on any sample (it has {sorted(seen)})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
