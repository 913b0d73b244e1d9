package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/outbox-sweeper/sweeper/metrics"
)

type rulesFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type rulesTests struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yamlv3.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// Every alert links a runbook entry that exists in docs/operations.md, and has a
// promtool test that fires it and one where it stays quiet.
func TestEveryAlertHasARunbookAndATest(t *testing.T) {
	t.Parallel()
	var rules rulesFile
	readYAML(t, "prometheus/alerts.yml", &rules)
	var tests rulesTests
	readYAML(t, "prometheus/alerts_test.yml", &tests)
	runbook, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var anchors []string
	for _, m := range regexp.MustCompile(`(?m)^#{1,6} (.+)$`).FindAllStringSubmatch(string(runbook), -1) {
		anchors = append(anchors, githubAnchor(m[1]))
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			url := r.Annotations["runbook_url"]
			const base = "https://github.com/outbox-sweeper/sweeper/blob/main/docs/operations.md#"
			if !strings.HasPrefix(url, base) {
				t.Errorf("%s: runbook_url %q does not point into docs/operations.md (%s…)", r.Alert, url, base)
			} else if anchor := strings.TrimPrefix(url, base); !slices.Contains(anchors, anchor) {
				t.Errorf("%s: runbook_url's anchor #%s is no heading of docs/operations.md", r.Alert, anchor)
			}
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: alerts_test.yml needs a case that fires it (%v) and one that does not (%v)", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	if n < 6 {
		t.Fatalf("found %d alert rules", n)
	}
}

// recorder is a Registerer that keeps what is registered, so the test can
// list the series names without a database behind the pool's collector.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

// exported returns the names of the series the sweeper exports.
func exported(t *testing.T) []string {
	rec := &recorder{}
	metrics.New(rec)
	metrics.RegisterPool(rec, nil)
	metrics.RegisterOutboxes(rec, nil, nil, 0)
	ch := make(chan *prometheus.Desc, 100)
	go func() {
		for _, c := range rec.cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	var names []string
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		names = append(names, m[1])
	}
	return names
}

// Every dashboard query names series the sweeper exports (a renamed metric
// fails here, not in an empty panel) and filters by the job, namespace and
// instance variables; every series the sweeper exports is on some panel.
func TestDashboardQueriesExportedSeriesWithItsVariables(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("grafana/outbox-sweeper.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	var vars []string
	for _, v := range dash.Templating.List {
		vars = append(vars, v.Name)
	}
	for _, want := range []string{"job", "namespace", "instance"} {
		if !slices.Contains(vars, want) {
			t.Errorf("the dashboard has no template variable %q", want)
		}
	}
	names := exported(t)
	used := map[string]bool{}
	series := regexp.MustCompile(`\b(outbox_[a-z_]+?)(_bucket|_count|_sum)?(\{[^}]*\})?[\[\s)]`)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			ms := series.FindAllStringSubmatch(tg.Expr+" ", -1)
			if len(ms) == 0 {
				t.Errorf("panel %q: no outbox series in %q", p.Title, tg.Expr)
			}
			for _, m := range ms {
				if !slices.Contains(names, m[1]) {
					t.Errorf("panel %q queries %s, which the sweeper does not export", p.Title, m[1])
				}
				if !strings.Contains(m[3], `job=~"$job"`) || !strings.Contains(m[3], `instance=~"$instance"`) || !strings.Contains(m[3], `namespace=~"$namespace"`) {
					t.Errorf("panel %q: %s is not filtered by the dashboard's variables: %q", p.Title, m[1], tg.Expr)
				}
				used[m[1]] = true
			}
		}
	}
	// Churn of connections shows as "opened"; why they closed is for a
	// query when that is the question.
	skip := []string{"outbox_db_pool_connections_closed_max_lifetime_total", "outbox_db_pool_connections_closed_max_idle_total"}
	for _, n := range names {
		if !used[n] && !slices.Contains(skip, n) {
			t.Errorf("no panel shows %s", n)
		}
	}
}
