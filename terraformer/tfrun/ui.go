package tfrun

import (
	"regexp"
	"strconv"
	"strings"

	tfjson "github.com/hashicorp/terraform-json"
)

// uiMessage is one line of Terraform's machine-readable UI (`-json`), the fields we use. The
// format is documented as "JSON output format" in Terraform's internals docs; terraform-json only
// types the generic messages, so the hook messages are typed here.
type uiMessage struct {
	Level      string             `json:"@level"`
	Message    string             `json:"@message"`
	Type       string             `json:"type"`
	Diagnostic *tfjson.Diagnostic `json:"diagnostic,omitempty"`
	Change     *uiChange          `json:"change,omitempty"`
	Hook       *uiHook            `json:"hook,omitempty"`
	Changes    *uiChangeSummary   `json:"changes,omitempty"`
}

type uiResource struct {
	Addr            string `json:"addr"`
	Module          string `json:"module"`
	ImpliedProvider string `json:"implied_provider"`
	ResourceType    string `json:"resource_type"`
	ResourceName    string `json:"resource_name"`
	ResourceKey     any    `json:"resource_key"`
}

type uiChange struct {
	Resource uiResource `json:"resource"`
	Action   string     `json:"action"`
}

type uiHook struct {
	Resource    uiResource `json:"resource"`
	Action      string     `json:"action"`
	IDValue     string     `json:"id_value"`
	Elapsed     float64    `json:"elapsed_seconds"`
	Provisioner string     `json:"provisioner"`
	Output      string     `json:"output"`
}

type uiChangeSummary struct {
	Add       int    `json:"add"`
	Change    int    `json:"change"`
	Import    int    `json:"import"`
	Remove    int    `json:"remove"`
	Operation string `json:"operation"`
}

func diagnosticFromJSON(d *tfjson.Diagnostic) Diagnostic {
	out := Diagnostic{
		Severity: string(d.Severity),
		Summary:  d.Summary,
		Detail:   d.Detail,
		Address:  d.Address,
	}
	if d.Range != nil {
		out.Filename = d.Range.Filename
		out.Line = d.Range.Start.Line
		out.Column = d.Range.Start.Column
	}
	return out
}

var (
	// "  on main.tf line 2, in resource "x" "y":" — the source location of a text diagnostic.
	diagOnRe = regexp.MustCompile(`^\s+on (.+?) line (\d+)(?:, in .*)?:$`)
	// Source snippet lines ("   2:   input = ") and expression value lines ("    ├────", "    │ x is 1").
	diagSnippetRe = regexp.MustCompile(`^\s+(\d+:|├|│|└)`)
)

// parseTextDiagnostics reads the diagnostics out of Terraform's human-readable output (run with
// -no-color). `terraform init` has no -json before Terraform 1.9, so this is how its errors (invalid
// configuration, unknown provider) are read.
//
//	Error: Invalid expression
//
//	  on main.tf line 2, in resource "terraform_data" "x":
//	   2:   input =
//
//	Expected the start of an expression, but found an invalid expression token.
func parseTextDiagnostics(out string) []Diagnostic {
	var diags []Diagnostic
	var cur *Diagnostic
	var detail []string
	finish := func() {
		if cur != nil {
			cur.Detail = strings.TrimSpace(strings.Join(detail, "\n"))
			diags = append(diags, *cur)
		}
		cur, detail = nil, nil
	}
	for _, line := range strings.Split(out, "\n") {
		// Boxed diagnostics ("│ Error: ...") appear when Terraform thinks it has a terminal.
		line = strings.TrimRight(line, " \r")
		for _, p := range []string{"╷", "╵", "│ ", "│"} {
			if strings.HasPrefix(line, p) {
				line = strings.TrimPrefix(line, p)
				break
			}
		}
		switch {
		case strings.HasPrefix(line, "Error: "):
			finish()
			cur = &Diagnostic{Severity: "error", Summary: strings.TrimPrefix(line, "Error: ")}
		case strings.HasPrefix(line, "Warning: "):
			finish()
			cur = &Diagnostic{Severity: "warning", Summary: strings.TrimPrefix(line, "Warning: ")}
		case cur == nil:
		case cur.Filename == "" && len(detail) == 0 && diagOnRe.MatchString(line):
			m := diagOnRe.FindStringSubmatch(line)
			cur.Filename = m[1]
			cur.Line, _ = strconv.Atoi(m[2])
		case diagSnippetRe.MatchString(line):
		default:
			if line != "" || len(detail) > 0 {
				detail = append(detail, line)
			}
		}
	}
	finish()
	return diags
}

// errorDiagnostics keeps the errors, dropping Terraform's generic preamble to init errors when a
// specific error follows it.
func errorDiagnostics(diags []Diagnostic) []Diagnostic {
	var out []Diagnostic
	for _, d := range diags {
		if d.Severity == "error" {
			out = append(out, d)
		}
	}
	if len(out) > 1 && strings.HasPrefix(out[0].Summary, "Terraform encountered problems during initiali") {
		out = out[1:]
	}
	return out
}
