#!/usr/bin/env python3
"""Structural check of a Grafana dashboard JSON (the classic JSON model that
provisioning loads) against Grafana's published dashboard schema.

  dashboard_schema.py DASHBOARD.json...

Prints one line per problem and exits 1 if there is any (2 on bad usage).
No network, no Grafana: Grafana cannot run on the machines that test this
repository, and the npm registry that carries `@grafana/schema` is not
reachable from them, so the rules below were read from the schema's sources
and written here by hand. They follow:

  - grafana/grafana kinds/dashboard/dashboard_kind.cue, lineage schema 0.0
    (read at commit 00139e84396be1600192135b87b8607f3f7b79d0, the schema of
    the Grafana 9.4-10.0 series; deploy/docker-compose.yml runs 9.5.3): the
    dashboard spec, #Panel, #RowPanel, #GridPos, #FieldConfigSource,
    #ValueMapping, #ThresholdsConfig, #VariableModel, #AnnotationQuery,
    #DashboardLink;
  - packages/grafana-schema/src/common/dataquery_gen.cue (every query has a
    refId) and public/app/plugins/datasource/prometheus/dataquery.cue (a
    Prometheus query has an expr; its editorMode and format enums);
  - packages/grafana-schema/src/common/mudball.cue: the legend, tooltip and
    single-stat options of the panel types this dashboard uses (timeseries,
    stat);
  - docs/sources/developers/kinds/core/dashboard/schema-reference.md, which
    lists schemaVersion as the only required field of the spec.

Fields the schema gives a default (editable, graphTooltip, a panel's
options, fieldConfig, transformations) may be absent: Grafana fills them in.
Where a field is present its type and range are checked; unknown top-level
keys are reported (a misspelt "panels" would otherwise show an empty
dashboard). Beyond the schema, three layout rules that Grafana's grid
enforces only by moving panels: every panel has a gridPos, x + w <= 24, and
no two panels overlap; and panel ids are unique, as Grafana keys panel state
and links on them.
"""
import json
import re
import sys

# Top-level fields of the dashboard spec (dashboard_kind.cue), plus what a
# dashboard exported "for sharing externally" carries.
TOP_LEVEL = {
    "id", "uid", "title", "description", "revision", "gnetId", "tags", "style",
    "timezone", "editable", "graphTooltip", "time", "timepicker",
    "fiscalYearStartMonth", "liveNow", "weekStart", "refresh", "schemaVersion",
    "version", "panels", "templating", "annotations", "links", "snapshot",
    "__inputs", "__elements", "__requires",
}
# Core panel plugins of Grafana 9.5 (ids of public/app/plugins/panel/*/plugin.json).
# Any string passes the schema; one outside this set renders as "panel plugin
# not found" unless installed, so it is reported.
PANEL_TYPES = {
    "alertlist", "annolist", "barchart", "bargauge", "candlestick", "canvas",
    "dashlist", "debug", "flamegraph", "gauge", "geomap", "gettingstarted",
    "graph", "heatmap", "histogram", "live", "logs", "news", "nodeGraph",
    "piechart", "row", "stat", "state-timeline", "status-history", "table",
    "table-old", "text", "timeseries", "traces", "trend", "welcome", "xychart",
}
VARIABLE_TYPES = {"query", "adhoc", "constant", "datasource", "interval", "textbox",
                  "custom", "system"}
# Variables Grafana defines in every query ($__interval and friends).
BUILTIN_VARIABLES = {"__interval", "__interval_ms", "__rate_interval", "__range",
                     "__range_s", "__range_ms", "__dashboard", "__org", "__user",
                     "__from", "__to", "__name", "timeFilter"}
GRID_COLUMNS = 24


class Checker:
    def __init__(self, name):
        self.name = name
        self.problems = []

    def fail(self, where, msg):
        self.problems.append(f"{self.name}: {where}: {msg}" if where else f"{self.name}: {msg}")

    # --- Types. JSON true/false load as bool, which Python counts as int.
    @staticmethod
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    @staticmethod
    def is_number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def want(self, obj, key, kind, where, required=False):
        """Checks obj[key] against kind ('string', 'bool', 'int', 'number',
        'object', 'list', 'nonempty'); returns the value or None."""
        if not isinstance(obj, dict) or key not in obj:
            if required:
                self.fail(where, f"{key} is missing")
            return None
        v = obj[key]
        ok = {
            "string": isinstance(v, str),
            "nonempty": isinstance(v, str) and v != "",
            "bool": isinstance(v, bool),
            "int": self.is_int(v),
            "number": self.is_number(v),
            "object": isinstance(v, dict),
            "list": isinstance(v, list),
        }[kind]
        if not ok:
            expected = "a non-empty string" if kind == "nonempty" else f"a JSON {kind}"
            self.fail(where, f"{key} is {json.dumps(v)[:60]}; expected {expected}")
            return None
        return v

    def want_enum(self, obj, key, allowed, where, required=False):
        if not isinstance(obj, dict) or key not in obj:
            if required:
                self.fail(where, f"{key} is missing")
            return
        if obj[key] not in allowed:
            self.fail(where, f"{key} is {json.dumps(obj[key])}; expected one of "
                      + ", ".join(json.dumps(a) for a in sorted(allowed, key=str)))

    def want_range(self, obj, key, lo, hi, where, required=False):
        v = self.want(obj, key, "int", where, required)
        if v is not None and not (lo <= v <= hi):
            self.fail(where, f"{key} is {v}; expected {lo}..{hi}")
        return v

    def want_strings(self, obj, key, where):
        v = self.want(obj, key, "list", where)
        if v is not None and not all(isinstance(s, str) for s in v):
            self.fail(where, f"{key} holds a non-string")

    def want_datasource(self, obj, key, where):
        """A data source reference: {type?, uid?} or null (#DataSourceRef)."""
        if not isinstance(obj, dict) or key not in obj or obj[key] is None:
            return
        ds = obj[key]
        if isinstance(ds, str):
            self.fail(where, f"{key} is the name {json.dumps(ds)}; the schema wants "
                      "a reference {\"type\": ..., \"uid\": ...}")
            return
        if not isinstance(ds, dict):
            self.fail(where, f"{key} is {json.dumps(ds)[:60]}; expected an object or null")
            return
        for k in ("type", "uid"):
            self.want(ds, k, "string", f"{where}.{key}")

    # --- The dashboard.
    def dashboard(self, d):
        if not isinstance(d, dict):
            self.fail("", "the top level is not a JSON object")
            return
        for k in sorted(set(d) - TOP_LEVEL):
            self.fail("", f"unknown top-level field {json.dumps(k)}")
        self.want_range(d, "schemaVersion", 0, 0xFFFF, "", required=True)
        if "id" in d and d["id"] is not None and not self.is_int(d["id"]):
            self.fail("", f"id is {json.dumps(d['id'])}; expected an integer or null")
        uid = self.want(d, "uid", "string", "")
        if uid is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", uid):
            self.fail("", f"uid {json.dumps(uid)} is not 1-40 letters, digits, '-' or '_'")
        for k in ("title", "description", "timezone", "weekStart", "gnetId"):
            self.want(d, k, "string", "")
        for k in ("editable", "liveNow"):
            self.want(d, k, "bool", "")
        self.want_strings(d, "tags", "")
        self.want_enum(d, "style", {"light", "dark"}, "")
        self.want_enum(d, "graphTooltip", {0, 1, 2}, "")
        self.want_range(d, "fiscalYearStartMonth", 0, 11, "")
        self.want_range(d, "version", 0, 0xFFFFFFFF, "")
        self.want(d, "revision", "int", "")
        if "refresh" in d and not (isinstance(d["refresh"], str) or d["refresh"] is False):
            self.fail("", f"refresh is {json.dumps(d['refresh'])}; expected a string or false")
        t = self.want(d, "time", "object", "")
        if t is not None:
            for k in ("from", "to"):
                self.want(t, k, "string", "time", required=True)
        tp = self.want(d, "timepicker", "object", "")
        if tp is not None:
            for k in ("hidden", "collapse", "enable"):
                self.want(tp, k, "bool", "timepicker")
            for k in ("refresh_intervals", "time_options"):
                self.want_strings(tp, k, "timepicker")
        for i, link in enumerate(self.want(d, "links", "list", "") or []):
            self.link(link, f"links[{i}]")
        self.templating(d)
        self.annotations(d)
        panels = self.want(d, "panels", "list", "")
        if panels is not None:
            self.panels(panels, d)

    def link(self, link, where):
        if not isinstance(link, dict):
            self.fail(where, "is not an object")
            return
        for k in ("title", "icon", "tooltip"):
            self.want(link, k, "string", where, required=True)
        self.want_enum(link, "type", {"link", "dashboards"}, where, required=True)
        self.want_strings(link, "tags", where)
        if "tags" not in link:
            self.fail(where, "tags is missing")
        for k in ("asDropdown", "targetBlank", "includeVars", "keepTime"):
            self.want(link, k, "bool", where)
        self.want(link, "url", "string", where)

    def templating(self, d):
        tm = self.want(d, "templating", "object", "")
        if tm is None:
            return
        names = set()
        for i, v in enumerate(self.want(tm, "list", "list", "templating") or []):
            where = f"templating.list[{i}]"
            if not isinstance(v, dict):
                self.fail(where, "is not an object")
                continue
            self.want_enum(v, "type", VARIABLE_TYPES, where, required=True)
            name = self.want(v, "name", "nonempty", where, required=True)
            if name in names:
                self.fail(where, f"variable {name} is defined twice")
            names.add(name)
            self.want_enum(v, "hide", {0, 1, 2}, where)
            for k in ("label", "description", "id"):
                self.want(v, k, "string", where)
            for k in ("skipUrlSync", "global"):
                self.want(v, k, "bool", where)
            if "query" in v and not isinstance(v["query"], (str, dict)):
                self.fail(where, "query is neither a string nor an object")
            self.want_datasource(v, "datasource", where)
        self.variables = names

    def annotations(self, d):
        an = self.want(d, "annotations", "object", "")
        if an is None:
            return
        for i, a in enumerate(self.want(an, "list", "list", "annotations") or []):
            where = f"annotations.list[{i}]"
            if not isinstance(a, dict):
                self.fail(where, "is not an object")
                continue
            self.want(a, "name", "string", where, required=True)
            self.want(a, "iconColor", "string", where, required=True)
            self.want(a, "enable", "bool", where, required=True)
            if "datasource" not in a:
                self.fail(where, "datasource is missing")
            self.want_datasource(a, "datasource", where)
            self.want(a, "hide", "bool", where)
            self.want(a, "type", "string", where)
            self.want_enum(a, "builtIn", {0, 1}, where)

    # --- Panels.
    def panels(self, panels, d):
        self.ids = {}
        top = []
        for i, p in enumerate(panels):
            where = f"panels[{i}]"
            box = self.panel(p, where, d)
            if box:
                top.append((self.describe(p, where), box))
            if isinstance(p, dict) and p.get("type") == "row":
                nested = []
                for j, q in enumerate(p.get("panels") or []):
                    qwhere = f"{where}.panels[{j}]"
                    if isinstance(q, dict) and q.get("type") == "row":
                        self.fail(qwhere, "a row inside a row")
                    qbox = self.panel(q, qwhere, d)
                    if qbox:
                        nested.append((self.describe(q, qwhere), qbox))
                # A collapsed row's panels are laid out when it opens.
                self.no_overlaps(nested)
        self.no_overlaps(top)

    def describe(self, p, where):
        title = p.get("title") if isinstance(p, dict) else None
        return f"{where} ({json.dumps(title)})" if isinstance(title, str) else where

    def panel(self, p, where, d):
        """Checks one panel; returns its grid box (x, y, w, h) or None."""
        if not isinstance(p, dict):
            self.fail(where, "is not an object")
            return None
        where = self.describe(p, where)
        ptype = self.want(p, "type", "nonempty", where, required=True)
        if ptype is not None and ptype not in PANEL_TYPES:
            self.fail(where, f"type {json.dumps(ptype)} is not a core panel plugin of Grafana 9.5")
        pid = p.get("id")
        if "id" not in p:
            self.fail(where, "id is missing (Grafana would assign one; links and state need it fixed)")
        elif not self.is_int(pid) or not 0 <= pid <= 0xFFFFFFFF:
            self.fail(where, f"id is {json.dumps(pid)}; expected an integer 0..2^32-1")
        elif pid in self.ids:
            self.fail(where, f"id {pid} is also the id of {self.ids[pid]}")
        else:
            self.ids[pid] = where
        for k in ("title", "description", "pluginVersion", "repeat", "interval", "timeFrom",
                  "timeShift"):
            self.want(p, k, "string", where)
        self.want(p, "transparent", "bool", where)
        self.want(p, "maxDataPoints", "number", where)
        self.want_enum(p, "repeatDirection", {"h", "v"}, where)
        self.want_datasource(p, "datasource", where)
        box = self.grid_pos(p, where)
        if ptype == "row":
            self.want(p, "collapsed", "bool", where)
            self.want(p, "panels", "list", where, required=True)
            return box
        self.targets(p, where, d)
        self.field_config(p, where)
        for i, tr in enumerate(self.want(p, "transformations", "list", where) or []):
            self.want(tr, "id", "nonempty", f"{where}.transformations[{i}]", required=True)
            self.want(tr, "disabled", "bool", f"{where}.transformations[{i}]")
        options = self.want(p, "options", "object", where)
        if options is not None:
            self.options(ptype, options, f"{where}.options")
        return box

    def grid_pos(self, p, where):
        g = self.want(p, "gridPos", "object", where)
        if g is None:
            if "gridPos" not in p:
                self.fail(where, "gridPos is missing (Grafana would stack it at 0,0)")
            return None
        gw = f"{where}.gridPos"
        h = self.want(g, "h", "int", gw, required=True)
        w = self.want(g, "w", "int", gw, required=True)
        x = self.want(g, "x", "int", gw, required=True)
        y = self.want(g, "y", "int", gw, required=True)
        self.want(g, "static", "bool", gw)
        ok = None not in (h, w, x, y)
        if h is not None and h < 1:
            self.fail(gw, f"h is {h}; expected at least 1")
            ok = False
        if w is not None and not 1 <= w <= GRID_COLUMNS:
            self.fail(gw, f"w is {w}; expected 1..{GRID_COLUMNS}")
            ok = False
        if x is not None and not 0 <= x < GRID_COLUMNS:
            self.fail(gw, f"x is {x}; expected 0..{GRID_COLUMNS - 1}")
            ok = False
        if y is not None and y < 0:
            self.fail(gw, f"y is {y}; expected at least 0")
            ok = False
        if ok and x + w > GRID_COLUMNS:
            self.fail(gw, f"x + w is {x + w}: past the {GRID_COLUMNS}-column grid")
        return (x, y, w, h) if ok else None

    def no_overlaps(self, boxes):
        for i, (wa, (xa, ya, wwa, ha)) in enumerate(boxes):
            for wb, (xb, yb, wwb, hb) in boxes[i + 1:]:
                if xa < xb + wwb and xb < xa + wwa and ya < yb + hb and yb < ya + ha:
                    self.fail(wb, f"gridPos overlaps {wa}")

    def targets(self, p, where, d):
        targets = self.want(p, "targets", "list", where)
        if targets is None:
            return
        panel_ds = p.get("datasource") if isinstance(p.get("datasource"), dict) else {}
        refs = set()
        for i, t in enumerate(targets):
            tw = f"{where}.targets[{i}]"
            if not isinstance(t, dict):
                self.fail(tw, "is not an object")
                continue
            ref = self.want(t, "refId", "nonempty", tw, required=True)
            if ref is not None:
                if ref in refs:
                    self.fail(tw, f"refId {ref} is used twice in the panel")
                refs.add(ref)
            self.want(t, "hide", "bool", tw)
            self.want(t, "queryType", "string", tw)
            self.want_datasource(t, "datasource", tw)
            ds = t.get("datasource") if isinstance(t.get("datasource"), dict) else panel_ds
            if ds.get("type") == "prometheus":
                expr = self.want(t, "expr", "nonempty", tw, required=True)
                for k in ("instant", "range", "exemplar"):
                    self.want(t, k, "bool", tw)
                self.want_enum(t, "editorMode", {"code", "builder"}, tw)
                self.want_enum(t, "format", {"time_series", "table", "heatmap"}, tw)
                self.want(t, "legendFormat", "string", tw)
                if expr:
                    self.variables_used(expr, tw)

    def variables_used(self, expr, where):
        defined = getattr(self, "variables", set()) | BUILTIN_VARIABLES
        for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expr):
            if name not in defined:
                self.fail(where, f"expr uses ${name}, which is no template variable")

    def field_config(self, p, where):
        fc = self.want(p, "fieldConfig", "object", where)
        if fc is None:
            return
        fw = f"{where}.fieldConfig"
        defaults = self.want(fc, "defaults", "object", fw, required=True)
        overrides = self.want(fc, "overrides", "list", fw, required=True)
        if defaults is not None:
            self.field_defaults(defaults, f"{fw}.defaults")
        for i, o in enumerate(overrides or []):
            ow = f"{fw}.overrides[{i}]"
            m = self.want(o, "matcher", "object", ow, required=True)
            if m is not None:
                self.want(m, "id", "string", f"{ow}.matcher", required=True)
            for j, prop in enumerate(self.want(o, "properties", "list", ow, required=True) or []):
                self.want(prop, "id", "string", f"{ow}.properties[{j}]", required=True)

    def field_defaults(self, f, where):
        for k in ("displayName", "displayNameFromDS", "description", "path", "unit", "noValue"):
            self.want(f, k, "string", where)
        for k in ("writeable", "filterable"):
            self.want(f, k, "bool", where)
        for k in ("decimals", "min", "max"):
            if k in f and f[k] is not None:
                self.want(f, k, "number", where)
        self.want(f, "custom", "object", where)
        self.want(f, "links", "list", where)
        for i, m in enumerate(self.want(f, "mappings", "list", where) or []):
            self.mapping(m, f"{where}.mappings[{i}]")
        th = self.want(f, "thresholds", "object", where)
        if th is not None:
            self.want_enum(th, "mode", {"absolute", "percentage"}, f"{where}.thresholds", required=True)
            for i, s in enumerate(self.want(th, "steps", "list", f"{where}.thresholds",
                                            required=True) or []):
                sw = f"{where}.thresholds.steps[{i}]"
                self.want(s, "color", "string", sw, required=True)
                # -Infinity, the first step's value, is written as null.
                if isinstance(s, dict) and s.get("value") is not None:
                    self.want(s, "value", "number", sw)
        color = self.want(f, "color", "object", where)
        if color is not None:
            self.want(color, "mode", "string", f"{where}.color", required=True)
            self.want(color, "fixedColor", "string", f"{where}.color")
            self.want_enum(color, "seriesBy", {"min", "max", "last"}, f"{where}.color")

    def mapping(self, m, where):
        if not isinstance(m, dict):
            self.fail(where, "is not an object")
            return
        self.want_enum(m, "type", {"value", "range", "regex", "special"}, where, required=True)
        opts = self.want(m, "options", "object", where, required=True)
        if opts is None:
            return
        kind = m.get("type")
        if kind == "value":
            for key, result in opts.items():
                self.want(opts, key, "object", f"{where}.options")
                if isinstance(result, dict):
                    self.mapping_result(result, f"{where}.options[{json.dumps(key)}]")
        elif kind in ("range", "regex", "special"):
            res = self.want(opts, "result", "object", f"{where}.options", required=True)
            if res is not None:
                self.mapping_result(res, f"{where}.options.result")
            if kind == "range":
                for k in ("from", "to"):
                    if opts.get(k) is not None:
                        self.want(opts, k, "number", f"{where}.options")
            elif kind == "regex":
                self.want(opts, "pattern", "string", f"{where}.options", required=True)
            else:
                self.want_enum(opts, "match", {"true", "false", "null", "nan", "null+nan", "empty"},
                               f"{where}.options", required=True)

    def mapping_result(self, r, where):
        for k in ("text", "color", "icon"):
            self.want(r, k, "string", where)
        self.want(r, "index", "int", where)

    def options(self, ptype, o, where):
        """The options of the panel types used here (mudball.cue)."""
        if ptype == "timeseries":
            legend = self.want(o, "legend", "object", where)
            if legend is not None:
                lw = f"{where}.legend"
                self.want_enum(legend, "displayMode", {"list", "table", "hidden"}, lw)
                self.want_enum(legend, "placement", {"bottom", "right"}, lw)
                self.want(legend, "showLegend", "bool", lw)
                self.want_strings(legend, "calcs", lw)
            tooltip = self.want(o, "tooltip", "object", where)
            if tooltip is not None:
                self.want_enum(tooltip, "mode", {"single", "multi", "none"}, f"{where}.tooltip")
                self.want_enum(tooltip, "sort", {"asc", "desc", "none"}, f"{where}.tooltip")
        elif ptype == "stat":
            ro = self.want(o, "reduceOptions", "object", where)
            if ro is not None:
                rw = f"{where}.reduceOptions"
                self.want_strings(ro, "calcs", rw)
                if "calcs" not in ro:
                    self.fail(rw, "calcs is missing")
                self.want(ro, "values", "bool", rw)
                self.want(ro, "fields", "string", rw)
                self.want(ro, "limit", "number", rw)
            self.want_enum(o, "orientation", {"auto", "vertical", "horizontal"}, where)
            self.want_enum(o, "colorMode", {"value", "background", "background_no_gradient", "none"},
                           where)
            self.want_enum(o, "graphMode", {"none", "line", "area"}, where)
            self.want_enum(o, "justifyMode", {"auto", "center"}, where)
            self.want_enum(o, "textMode", {"auto", "value", "value_and_name", "name", "none"}, where)


def check_file(path):
    """The problems of one dashboard file, as printable lines."""
    c = Checker(path)
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        c.fail("", f"not readable JSON: {e}")
        return c.problems
    c.variables = set()
    c.dashboard(d)
    return c.problems


def main(argv):
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    problems = []
    for path in argv[1:]:
        problems += check_file(path)
    for p in problems:
        print(p)
    if not problems:
        print(f"dashboard_schema: {len(argv) - 1} dashboard(s), no problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
