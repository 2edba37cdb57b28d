#!/usr/bin/env python3
"""Runs every query of a Grafana dashboard against a live Prometheus.

  dashboard_queries.py DASHBOARD.json PROMETHEUS_URL [--may-be-empty=TITLE]...

No Grafana server can run where this is tested, so the dashboard's panels
are checked by their queries instead of by rendering them: each panel's
every `expr` goes to Prometheus's HTTP API (/api/v1/query, evaluated now) and
must be accepted (status "success") and return at least one series, unless
its panel's title is given with --may-be-empty (a panel whose series exist
only after an event, e.g. a checkpoint). Prints one line per query and exits
1 if any query fails or is empty when it may not be, 2 on bad usage.
Callers: tests/e2e/local_monitor_test.sh (deploy/local.sh --monitor).
"""
import json
import sys
import urllib.error
import urllib.parse
import urllib.request


def query(base, expr, timeout=10):
    """(result list, None) or (None, error text) for one instant query."""
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:  # 400/422: Prometheus says why in JSON
        try:
            body = json.load(e)
        except ValueError:
            return None, f"HTTP {e.code}"
    except (OSError, ValueError) as e:
        return None, f"no answer: {e}"
    if body.get("status") != "success":
        return None, f"{body.get('errorType', '?')}: {body.get('error', body)}"
    return body["data"]["result"], None


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--may-be-empty=")]
    may_be_empty = {a.split("=", 1)[1] for a in argv[1:] if a.startswith("--may-be-empty=")}
    if len(args) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    dash_path, base = args
    with open(dash_path) as f:
        panels = json.load(f)["panels"]
    titles = {p.get("title") for p in panels}
    bad = [f"--may-be-empty names no panel: {t}" for t in sorted(may_be_empty - titles)]
    n = 0
    for p in panels:
        for t in p.get("targets", []):
            expr = t.get("expr")
            if not expr:
                continue
            n += 1
            result, err = query(base, expr)
            label = f"{p.get('title')} [{t.get('refId')}]: {expr}"
            if err is not None:
                bad.append(f"{label}: rejected: {err}")
            elif not result and p.get("title") not in may_be_empty:
                bad.append(f"{label}: no data")
            else:
                allowed = " (may be empty)" if not result else ""
                print(f"ok {len(result)} series{allowed}: {label}")
    for line in bad:
        print(f"FAIL {line}")
    print(f"dashboard_queries: {n} queries, {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
