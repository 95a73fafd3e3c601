package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
)

// Quotas: kloud quota set|show (quota.set, quota.show; kloud/quota.go).

// formatMB shows MB as G when they are whole G.
func formatMB(n int64) string {
	if n >= 1024 && n%1024 == 0 {
		return strconv.FormatInt(n>>10, 10) + "G"
	}
	return strconv.FormatInt(n, 10) + "M"
}

// quotaCmd is `kloud quota set|show`.
func quotaCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Per user and per team quotas: machines, cores, memory, disk, buckets",
		Long: `A quota limits what a user's (or a team's) stacks that are built or being built hold:
machines, cores, memory and disk, as the machines' planned attributes say. stack plan, create,
apply, update and scale are refused when the stack would not fit. It also limits the bucket
claims their stacks hold and the space they claim (the sum of their max_size_mb; under such a
limit every claim must set one), checked by stack plan, create and update and before a build
provisions buckets. No quota is set by default. A team's pool quota (--pool TEAM) limits what
the prebuilt stacks of its pools hold until users claim them (kloud pool); they count against
no user's quota and not against the team's.`,
	}
	var sp api.QuotaSetParams
	var mem, disk, bucketSize string
	set := &cobra.Command{
		Use:   "set --user U|--team T|--pool T [--machines N] [--cores N] [--memory SIZE] [--disk SIZE] [--buckets N] [--bucket-size SIZE]",
		Short: "Set a user's, a team's or a team's pools' quota (kloud administrators; limits not given: none)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if sp.Limit.MemoryMB, err = kloud.ParseMB(mem); err != nil {
				return fmt.Errorf("--memory: %w", err)
			}
			if sp.Limit.DiskMB, err = kloud.ParseMB(disk); err != nil {
				return fmt.Errorf("--disk: %w", err)
			}
			if sp.Limit.BucketMB, err = kloud.ParseMB(bucketSize); err != nil {
				return fmt.Errorf("--bucket-size: %w", err)
			}
			st, err := call(cmd.Context(), g, (*api.Client).QuotaSet, sp)
			if err != nil {
				return err
			}
			return printQuota(g, st)
		},
	}
	set.Flags().StringVar(&sp.User, "user", "", "the user")
	set.Flags().StringVar(&sp.Team, "team", "", "the team")
	set.Flags().StringVar(&sp.Pool, "pool", "", "the team whose pools' quota this is (their stacks no user claimed yet)")
	set.Flags().Int64Var(&sp.Limit.Machines, "machines", 0, "machines (0: no limit)")
	set.Flags().Float64Var(&sp.Limit.Cores, "cores", 0, "cores (0: no limit)")
	set.Flags().StringVar(&mem, "memory", "0", "memory: MB, or with M, G, T (8G; 0: no limit)")
	set.Flags().StringVar(&disk, "disk", "0", "disk: MB, or with M, G, T (50G; 0: no limit)")
	set.Flags().Int64Var(&sp.Limit.Buckets, "buckets", 0, "bucket claims (0: no limit)")
	set.Flags().StringVar(&bucketSize, "bucket-size", "0", "the buckets' max_size_mb in all: MB, or with M, G, T (10G; 0: no limit)")
	var shp api.QuotaShowParams
	show := &cobra.Command{
		Use:   "show [--user U|--team T|--pool T]",
		Short: "Show a quota: limit, use and what is left (default: your own)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := call(cmd.Context(), g, (*api.Client).QuotaShow, shp)
			if err != nil {
				return err
			}
			return printQuota(g, st)
		},
	}
	show.Flags().StringVar(&shp.User, "user", "", "the user (kloud administrators; default: you)")
	show.Flags().StringVar(&shp.Team, "team", "", "the team")
	show.Flags().StringVar(&shp.Pool, "pool", "", "the team whose pools' quota to show")
	cmd.AddCommand(set, show)
	return cmd
}

// defaultQuotaFlag is kloud serve's --default-quota (kloud.ParseQuota).
type defaultQuotaFlag struct{ q *api.Quota }

func (f defaultQuotaFlag) String() string {
	if f.q == nil || *f.q == (api.Quota{}) {
		return "none"
	}
	return fmt.Sprintf("machines=%d,cores=%s,memory=%s,disk=%s,buckets=%d,bucketBytes=%s", f.q.Machines, strconv.FormatFloat(f.q.Cores, 'f', -1, 64), formatMB(f.q.MemoryMB), formatMB(f.q.DiskMB),
		f.q.Buckets, formatMB(f.q.BucketMB))
}

func (f defaultQuotaFlag) Set(s string) error {
	q, err := kloud.ParseQuota(s)
	if err != nil {
		return err
	}
	*f.q = q
	return nil
}

func (f defaultQuotaFlag) Type() string { return "LIMITS" }

func printQuota(g *globals, st api.QuotaStatus) error {
	if g.json {
		return g.printJSON(st)
	}
	fmt.Fprintf(g.stdout, "quota of %s\n", strings.Replace(st.Subject, "/", " ", 1))
	t := newTable(g.stdout, "RESOURCE", "USED", "LIMIT", "LEFT")
	row := func(name string, used, limit, left float64, f func(float64) string) {
		if limit <= 0 {
			t.row(name, f(used), "unlimited", "-")
			return
		}
		t.row(name, f(used), f(limit), f(left))
	}
	n := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	mb := func(v float64) string { return formatMB(int64(v)) }
	row("machines", float64(st.Used.Machines), float64(st.Limit.Machines), float64(st.Left.Machines), n)
	row("cores", st.Used.Cores, st.Limit.Cores, st.Left.Cores, n)
	row("memory", float64(st.Used.MemoryMB), float64(st.Limit.MemoryMB), float64(st.Left.MemoryMB), mb)
	row("disk", float64(st.Used.DiskMB), float64(st.Limit.DiskMB), float64(st.Left.DiskMB), mb)
	row("buckets", float64(st.Used.Buckets), float64(st.Limit.Buckets), float64(st.Left.Buckets), n)
	row("bucket size", float64(st.Used.BucketMB), float64(st.Limit.BucketMB), float64(st.Left.BucketMB), mb)
	return t.flush()
}
