#!/usr/bin/env python3
"""The dashboard schema check (dashboard_schema.py) on broken dashboards:
each is the real deploy/grafana/dashboards/pserver.json with one thing
broken, and the check must name that thing; the real one passes.

  python3 -m unittest tests/e2e/dashboard_schema_test.py   (ctest grafana.dashboard_schema_rules_selftest)
"""
import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dashboard_schema  # noqa: E402

DASHBOARD = os.path.join(HERE, "..", "..", "deploy", "grafana", "dashboards", "pserver.json")


def load():
    with open(DASHBOARD) as f:
        return json.load(f)


class DashboardSchemaTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def problems(self, dashboard=None, text=None):
        path = os.path.join(self.tmp.name, "d.json")
        with open(path, "w") as f:
            f.write(text if text is not None else json.dumps(dashboard))
        return dashboard_schema.check_file(path)

    def assertFlags(self, dashboard, *fragments):
        found = self.problems(dashboard)
        for fragment in fragments:
            self.assertTrue(any(fragment in p for p in found),
                            f"no problem mentions {fragment!r}; got {found}")

    def test_the_dashboard_passes(self):
        self.assertEqual(self.problems(load()), [])

    def test_not_json(self):
        found = self.problems(text='{"panels": [}')
        self.assertEqual(len(found), 1)
        self.assertIn("not readable JSON", found[0])

    def test_top_level(self):
        d = load()
        del d["schemaVersion"]
        self.assertFlags(d, "schemaVersion is missing")
        d = load()
        d["schemaVersion"] = "38"
        self.assertFlags(d, 'schemaVersion is "38"; expected a JSON int')
        d = load()
        d["pannels"] = d.pop("panels")
        self.assertFlags(d, 'unknown top-level field "pannels"')
        d = load()
        d["graphTooltip"] = 3
        d["refresh"] = 5
        d["uid"] = "x" * 41
        self.assertFlags(d, "graphTooltip is 3", "refresh is 5", "is not 1-40 letters")
        d = load()
        d["time"] = {"from": "now-15m"}
        d["tags"] = ["pserver", 7]
        self.assertFlags(d, "time: to is missing", "tags holds a non-string")

    def test_grid(self):
        d = load()
        d["panels"][0]["gridPos"]["w"] = 25
        self.assertFlags(d, "w is 25; expected 1..24")
        d = load()
        d["panels"][1]["gridPos"] = {"x": 20, "y": 0, "w": 12, "h": 8}
        self.assertFlags(d, "x + w is 32")
        d = load()
        d["panels"][0]["gridPos"]["x"] = 1.5
        d["panels"][2]["gridPos"]["h"] = True
        self.assertFlags(d, "x is 1.5; expected a JSON int", "h is true; expected a JSON int")
        d = load()
        del d["panels"][3]["gridPos"]
        self.assertFlags(d, "gridPos is missing")

    def test_overlap(self):
        d = load()
        d["panels"][1]["gridPos"] = dict(d["panels"][0]["gridPos"], x=6)
        self.assertFlags(d, "panels[1] (\"Round time quantiles\"): gridPos overlaps panels[0]")
        # Side by side and one below the other is fine.
        d = load()
        d["panels"] = d["panels"][:2]
        d["panels"][1]["gridPos"] = dict(d["panels"][0]["gridPos"], y=8)
        self.assertEqual(self.problems(d), [])

    def test_ids(self):
        d = load()
        d["panels"][4]["id"] = d["panels"][0]["id"]
        self.assertFlags(d, "id 1 is also the id of panels[0]")
        d = load()
        del d["panels"][2]["id"]
        d["panels"][3]["id"] = -1
        self.assertFlags(d, "id is missing", "id is -1")

    def test_panel_fields(self):
        d = load()
        d["panels"][0]["type"] = "timeserie"
        d["panels"][1]["type"] = ""
        self.assertFlags(d, '"timeserie" is not a core panel plugin', "type is \"\"")
        d = load()
        d["panels"][0]["datasource"] = "Prometheus"
        d["panels"][1]["transparent"] = "no"
        self.assertFlags(d, 'datasource is the name "Prometheus"', 'transparent is "no"')

    def test_targets(self):
        d = load()
        del d["panels"][0]["targets"][0]["refId"]
        self.assertFlags(d, "targets[0]: refId is missing")
        d = load()
        d["panels"][1]["targets"][1]["refId"] = "A"
        self.assertFlags(d, "refId A is used twice")
        d = load()
        del d["panels"][2]["targets"][0]["expr"]
        self.assertFlags(d, "targets[0]: expr is missing")
        d = load()
        d["panels"][2]["targets"][0]["expr"] = "rate(pserver_server_step{job=\"$job\"}[1m])"
        d["panels"][2]["targets"][0]["format"] = "series"
        self.assertFlags(d, "expr uses $job, which is no template variable", 'format is "series"')
        # $__rate_interval is Grafana's own.
        d = load()
        d["panels"][2]["targets"][0]["expr"] = "rate(pserver_server_step[$__rate_interval])"
        self.assertEqual(self.problems(d), [])

    def test_field_config_and_options(self):
        d = load()
        del d["panels"][0]["fieldConfig"]["defaults"]
        self.assertFlags(d, "fieldConfig: defaults is missing")
        d = load()
        stage = next(p for p in d["panels"] if p["title"] == "Optimizer stage")
        stage["fieldConfig"]["defaults"]["mappings"][0]["type"] = "values"
        stage["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute",
                                                          "steps": [{"value": None}]}
        stage["options"]["graphMode"] = "bars"
        self.assertFlags(d, 'type is "values"', "steps[0]: color is missing", 'graphMode is "bars"')
        d = load()
        d["panels"][0]["options"]["legend"]["displayMode"] = "lists"
        d["panels"][0]["options"]["tooltip"]["mode"] = "all"
        self.assertFlags(d, 'displayMode is "lists"', 'mode is "all"')

    def test_templating_and_annotations(self):
        d = load()
        d["templating"]["list"] = [{"type": "query", "name": "job"}, {"type": "dropdown", "name": "job"}]
        d["annotations"]["list"] = [{"name": "deploys", "enable": True,
                                     "datasource": {"type": "prometheus", "uid": "pserver-prometheus"}}]
        self.assertFlags(d, 'type is "dropdown"', "variable job is defined twice",
                         "annotations.list[0]: iconColor is missing")
        d = load()
        d["templating"]["list"] = [{"type": "query", "name": "job", "hide": 0}]
        d["panels"][0]["targets"][0]["expr"] = 'rate(pserver_server_step{job="$job"}[1m])'
        self.assertEqual(self.problems(d), [])

    def test_rows(self):
        d = load()
        inner = copy.deepcopy(d["panels"][:2])
        inner[1]["gridPos"] = dict(inner[0]["gridPos"])
        for p in inner:
            p["id"] += 100
        d["panels"].append({"id": 99, "type": "row", "title": "more", "collapsed": True,
                            "gridPos": {"x": 0, "y": 200, "w": 24, "h": 1}, "panels": inner})
        row = len(d["panels"]) - 1
        self.assertFlags(d, f"panels[{row}].panels[1] (\"Round time quantiles\"): gridPos overlaps "
                         f"panels[{row}].panels[0]")

    def test_command_line(self):
        path = os.path.join(self.tmp.name, "broken.json")
        d = load()
        d["panels"][0]["gridPos"]["w"] = 30
        with open(path, "w") as f:
            json.dump(d, f)
        script = os.path.join(HERE, "dashboard_schema.py")
        bad = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
        self.assertIn("w is 30", bad.stdout)
        good = subprocess.run([sys.executable, script, DASHBOARD], capture_output=True, text=True)
        self.assertEqual(good.returncode, 0, good.stdout + good.stderr)


if __name__ == "__main__":
    unittest.main()
