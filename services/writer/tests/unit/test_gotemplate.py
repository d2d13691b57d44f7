"""ntfy's template mode against Go itself: every case runs through ``ingest.replace_template`` and through
a small Go program doing what ntfy's ``replaceTemplate`` does with Go's own ``text/template`` (built from
the standard library with the ``go`` on PATH, offline), and the two must agree on the output or the error.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from upf_edge import NtfyError
from upf_writer import ingest

ORACLE = r"""
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"text/template"
)

var disallowed = regexp.MustCompile(`(?m)\{\{-?\s*(call|template|define)\b`)

func replace(tpl, source string) (string, int) { // ntfy's replaceTemplate (server.go), its codes
	if disallowed.MatchString(tpl) {
		return "", 40044
	}
	var data any
	if err := json.Unmarshal([]byte(source), &data); err != nil {
		return "", 40042
	}
	t, err := template.New("").Parse(tpl)
	if err != nil {
		return "", 40043
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		return "", 40045
	}
	return buf.String(), 0
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var c struct{ Tpl, Data string }
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			panic(err)
		}
		s, code := replace(c.Tpl, c.Data)
		if code != 0 {
			_ = out.Encode(map[string]any{"code": code})
		} else {
			_ = out.Encode(map[string]any{"out": s})
		}
	}
}
"""

DATA = json.dumps(
    {"a": {"b": "x", "n": 12345678, "f": 1.5, "l": [1, "two", None, True], "e": [], "m": {}},
     "s": "hi", "t": True, "f": False, "z": None, "k": {"b": 2, "a": 1, "c": [1, {"d": "e"}]},
     "big": 1e21, "small": 0.00001, "neg": -3, "third": 0.3333333333333333, "hund": 100000, "mil": 1000000,
     "u": "héllo wörld", "esc": "<a href='x'>&\"</a>", "nl": "a\nb", "dash-key": "dk", "zero": 0, "empty": ""}
)  # fmt: skip

TEMPLATES = [
    # fields, missing keys, nulls, printing
    "{{.a.b}}", "{{.missing}}", "{{.missing.x.y}}", "{{.z}}", "{{.z.q}}", "{{.}}", "{{.a}}", "{{.a.l}}",
    "{{.k}}", "{{.a.e}}", "{{.a.m}}", "{{.a.n}}", "{{.a.f}}", "{{.big}}", "{{.small}}", "{{.neg}}",
    "{{.third}}", "{{.hund}}", "{{.mil}}", "{{.u}}", "{{.t}} {{.f}}", "{{.s.x}}", "{{.a.l.x}}",
    "{{index . \"dash-key\"}}", "{{.zero}}{{.empty}}", "plain text only", "", "{{.nl}}",
    # control structures
    "{{if .t}}yes{{else}}no{{end}}", "{{if .f}}yes{{else}}no{{end}}", "{{if .missing}}a{{else if .s}}b{{else}}c{{end}}",
    "{{if .zero}}a{{else if .empty}}b{{else}}c{{end}}", "{{with .a}}{{.b}}{{end}}", "{{with .missing}}a{{else}}b{{end}}",
    "{{with .missing}}a{{else with .s}}{{.}}{{end}}", "{{range .a.l}}[{{.}}]{{end}}", "{{range .k}}{{.}};{{end}}",
    "{{range $k, $v := .k}}{{$k}}={{$v}} {{end}}", "{{range $i, $v := .a.l}}{{$i}}:{{$v}} {{end}}",
    "{{range .a.e}}x{{else}}empty{{end}}", "{{range .missing}}x{{else}}none{{end}}", "{{range .z}}x{{else}}nul{{end}}",
    "{{range .a.n}}x{{end}}", "{{range 3}}{{.}}{{end}}", "{{range $v := .a.l}}{{if not $v}}{{break}}{{end}}{{$v}};{{end}}",
    "{{range .a.l}}{{if eq . \"two\"}}{{continue}}{{end}}{{.}};{{end}}", "{{range .k.c}}{{.}}|{{end}}",
    # variables and scope
    "{{$x := .s}}{{$x}}", "{{$x := 1}}{{$x = 2}}{{$x}}", "{{$x := 1}}{{if .t}}{{$x = 3}}{{end}}{{$x}}",
    "{{with $x := .a}}{{$x.b}}{{end}}", "{{$.s}}", "{{with .a}}{{$.s}}{{.b}}{{end}}", "{{$y}}",
    "{{if $x := .s}}{{$x}}{{else}}{{$x}}{{end}}", "{{range $i, $e := .a.l}}{{end}}{{$i}}",
    # pipelines, parens, functions
    "{{.s | printf \"%q\"}}", "{{\"a\" | printf \"%s-%s\" \"b\"}}", "{{printf \"%d|%5.2f|%x|%t|%%|%v\" 42 .a.f 255 .t .k}}",
    "{{printf \"%d\" .a.n}}", "{{printf \"%s\" .a.n}}", "{{printf \"%s\"}}", "{{printf \"x\" 1}}", "{{printf \"%-5s|\" \"ab\"}}",
    "{{print 1 2 \"a\" 3 .t}}", "{{print .missing}}", "{{print .z .s}}", "{{println .s 1}}", "{{len .u}}", "{{len .a.l}}",
    "{{len .k}}", "{{len .a.n}}", "{{len .missing}}", "{{index .a.l 1}}", "{{index .k \"b\"}}", "{{index .k \"q\"}}",
    "{{index .a.l 9}}", "{{index .a.l .zero}}", "{{index .k.c 1 \"d\"}}", "{{(index .a.l 1)}}", "{{(.a).b}}",
    "{{(index .k.c 1).d}}", "{{slice .s 1}}", "{{slice .a.l 1 3}}", "{{eq .s \"hi\"}}", "{{eq .s \"no\" \"hi\"}}",
    "{{eq .a.f 1.5}}", "{{eq .a.n 12345678}}", "{{eq .missing .z}}", "{{ne .s \"hi\"}}", "{{lt 1 2}}", "{{lt .a.f 2.0}}",
    "{{lt .a.f 2}}", "{{gt \"b\" \"a\"}}", "{{le .s .missing}}", "{{eq .k .k}}", "{{and .s 0 .t}}", "{{and .s .t}}",
    "{{or 0 \"\" .s}}", "{{or 0 .empty}}", "{{not .t}}", "{{not .a.l}}", "{{html .esc}}", "{{js .esc}}",
    "{{urlquery \"a b&c/é\"}}", "{{.esc | html}}", "{{nil}}", "{{.s 1}}", "{{print nil}}", "{{eq nil .missing}}",
    # lexing: trims, comments, literals
    "a  {{- .s -}}  b", "a {{- /* note */ -}} b", "{{/* only a comment */}}", "{{`raw \\n`}}", "{{\"esc\\t\\u00e9\"}}",
    "{{'a'}}", "{{0x1F}}", "{{1e3}}", "{{-2}}", "{{ .s }}", "{{.s}}{{.s}}",
    # parse errors, disallowed
    "{{.s", "{{end}}", "{{if .t}}x", "{{nosuchfn .s}}", "{{else}}", "{{if}}x{{end}}", "{{.s | 1}}", "{{(.s}}",
    "{{template \"x\"}}", "{{define \"x\"}}y{{end}}", "{{ call .s }}", "{{- call .s}}", "{{block \"b\" .}}x{{end}}",
    "{{break}}", "{{ /* spaced */ }}", "{{block \"b\" .a}}{{.b}}{{$.b}}{{end}}", "{{$x := 1}}{{block \"b\" .}}{{$x}}{{end}}",
    "{{block \"b\" .a.l}}{{range .}}{{.}}{{end}}{{end}}!", "{{block .s .}}x{{end}}",
    # more edges
    "{{-\t.s}}", "{{ - .s}}", "{{.s -}} x", "{{.s-}}", "{{.héllo}}", "{{.a.l | len}}", "{{len}}", "{{index}}",
    "{{and}}", "{{not}}", "{{eq 1}}", "{{slice .a.n}}", "{{printf \"%.1f\" 2}}", "{{printf \"%v\" .a.l}}",
    "{{printf \"%s\" .a.l}}", "{{printf \"%s\" .k}}", "{{printf \"%d\" 3}}", "{{printf \"%q\" 3}}", "{{printf \"%5d|%-4d|%04d\" 1 2 3}}",
    "{{printf \"%e\" .a.f}}", "{{printf \"%g\" .big}}", "{{printf \"%.3g\" .third}}", "{{printf \"%x\" .s}}",
    "{{if and .s (not .f)}}ok{{end}}", "{{if or .missing .z}}y{{else}}n{{end}}", "{{with $v := index .k.c 1}}{{$v.d}}{{end}}",
    "{{range $i, $v := .k.c}}{{if $i}},{{end}}{{$v}}{{end}}", "{{if eq .neg -3.0}}m{{end}}", "{{lt .s 1}}", "{{eq .a.l .a.l}}",
    "{{range .a.l}}{{range .}}{{end}}{{end}}", "{{ .s|print }}", "{{.s|print|len}}", "{{printf \"%v\" (eq 1 1)}}",
    "{{printf \"%s|%v\" .missing .z}}", "{{printf \"%q\" .nl}}", "{{printf \"%c%c\" 72 105}}", "{{printf \"%q\" \"é\\x01\"}}",
    "{{\"unterminated}}", "{{`multi\nline`}}", "{{/* unclosed", "{{.s}}}}", "}}{{.s}}", "{{{.s}}",
]  # fmt: skip

OTHER_DATA = [
    ("{{.}}", "null"), ("{{.a}}", "null"), ("{{.a.b}}", "null"), ("{{index . 1}}", "[1,2]"), ("{{.}}", '"str"'),
    ("{{.}}", "12"), ("{{.}}", "not json"), ("{{.}}", ""), ("{{.}}", '{"a":1} x'), ("{{.}}", "1e400"),
    ("{{.a}}", '{"a":1,"a":2}'), ("{{.A}}", '{"a":1}'), ("{{.}}", "true"), ("{{range .}}{{.}}{{end}}", "[3,1,2]"),
    ("x", "[]"), ("{{.a}}", '{"a":"\\ud83d\\ude00"}'),
]  # fmt: skip


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("no go on PATH: Go's text/template is the oracle these cases compare with")
    d = tmp_path_factory.mktemp("gotemplate")
    (d / "main.go").write_text(ORACLE)
    subprocess.run([go, "build", "-o", str(d / "oracle"), "main.go"], cwd=d, check=True, timeout=300)
    return d / "oracle"


def go_results(oracle: Path, cases: list[tuple[str, str]]) -> list[dict[str, object]]:
    lines = "".join(json.dumps({"tpl": t, "data": d}) + "\n" for t, d in cases)
    out = subprocess.run([str(oracle)], input=lines, capture_output=True, text=True, check=True, timeout=60)
    return [json.loads(line) for line in out.stdout.splitlines()]


def ours(template: str, data: str) -> dict[str, object]:
    try:
        return {"out": ingest.replace_template(template, data.encode(), 1 << 20)}
    except NtfyError as e:
        return {"code": e.problem.code}


def test_templates_render_as_go_renders_them(oracle: Path) -> None:
    cases = [(t, DATA) for t in TEMPLATES] + OTHER_DATA
    expected = go_results(oracle, cases)
    assert len(expected) == len(cases)
    diffs = [(t, d[:20], want, ours(t, d)) for (t, d), want in zip(cases, expected, strict=True) if ours(t, d) != want]
    assert diffs == []


# --- the publish: ntfy's template mode around the rendering -------------------------------------------
LIMITS = ingest.Limits(max_message_bytes=4096, default_ttl_secs=86400)
NOW = 1_784_214_948


def publish(headers: dict[str, str], body: bytes, query: dict[str, str] | None = None) -> ingest.Ingested:
    return ingest.ingest_publish("alerts", headers, query or {}, body, now=NOW, limits=LIMITS)


def refused(code: int, headers: dict[str, str], body: bytes, query: dict[str, str] | None = None) -> None:
    with pytest.raises(NtfyError) as e:
        publish(headers, body, query)
    assert e.value.problem.code == code


def test_template_mode_renders_message_and_title_over_the_json_body() -> None:
    body = json.dumps({"alert": {"name": "disk", "level": 3}, "pad": "x" * 20_000}).encode()  # past 4096: allowed
    env = publish(
        {"x-template": "yes", "x-message": "{{.alert.name}} at {{.alert.level}}", "x-title": "[{{.alert.name}}]"}, body
    ).envelope
    assert (env.message, env.title, env.encoding) == ("disk at 3", "[disk]", "")
    env = publish({}, b'{"a":"q"}', {"tpl": "1", "m": "got {{.a}}"}).envelope
    assert env.message == "got q"
    assert publish({"x-template": "yes"}, b"{}").envelope.message == "triggered"  # no message template


def test_template_errors_and_limits_are_ntfys() -> None:
    refused(40042, {"x-template": "yes", "x-message": "{{.a}}"}, b"not json")
    refused(40043, {"x-template": "yes", "x-message": "{{.a"}, b"{}")
    refused(40044, {"x-template": "yes", "x-message": '{{template "x"}}'}, b"{}")
    refused(40045, {"x-template": "yes", "x-message": "{{.a.b}}"}, b'{"a":null}')
    refused(
        40041,
        {"x-template": "yes", "x-message": "{{range .l}}{{$.s}}{{end}}"},
        json.dumps({"l": list(range(50)), "s": "y" * 100}).encode(),
    )
    refused(41303, {"x-template": "yes"}, b" " * 32_768)
    assert publish({"x-template": "yes"}, b"{}" + b" " * 32_765).envelope.message == "triggered"
    refused(41301, {}, b"x" * 4097)  # without template mode, the message limit


def test_template_mode_yields_to_unifiedpush_and_attachments_as_in_ntfy() -> None:
    """ntfy's handlePublishBody decides UnifiedPush mode and an attachment URL before template mode."""
    env = publish({"x-template": "yes", "x-message": "{{.a}}"}, b'{"a":"b"}', {"up": "1"}).envelope
    assert env.message == '{"a":"b"}'
    env = publish({"x-template": "yes", "x-attach": "https://f.example/x.png"}, b'{"a":"b"}').envelope
    assert env.message == '{"a":"b"}'
