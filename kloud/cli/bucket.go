package cli

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud/api"
)

// Buckets: kloud bucket list|credentials|grant|revoke|delete (docs/buckets.md "Claims").

// bucketCmd is `kloud bucket`.
func bucketCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "bucket", Short: "Object buckets of stacks: list, your keys, grant, revoke, delete",
		Long: `Object buckets that stacks claim with kloud_bucket blocks in their templates: building the
stack provisions them, its machines find them in their environment, destroying the stack deletes
them (or keeps them with retain = true). A bucket is named by its stack and its block's name.`}

	var lstack string
	list := &cobra.Command{
		Use:   "list [--stack STACK]",
		Short: "List the buckets of your stacks (and of your team's, as a team admin) and those granted to you",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).BucketList, api.BucketListParams{StackID: lstack})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			tw := newTable(g.stdout, "STACK", "LABEL", "BUCKET", "OWNER", "STATE", "RETAIN", "ENDPOINT", "GRANTS")
			for _, b := range res.Buckets {
				var grants []string
				for _, u := range slices.Sorted(maps.Keys(b.Grants)) {
					grants = append(grants, u+":"+b.Grants[u])
				}
				tw.row(b.StackID, b.Label, b.Bucket, b.Owner, b.State, fmt.Sprint(b.Retain), b.Endpoint, strings.Join(grants, ","))
			}
			tw.flush()
			return nil
		},
	}
	list.Flags().StringVar(&lstack, "stack", "", "only this stack's buckets")

	creds := &cobra.Command{
		Use:   "credentials STACK LABEL",
		Short: "Print your own key to a bucket, as environment variables (or --json)",
		Long: `Print your own key to a bucket: the stack owner's (write), or the one a grant gave you.
The output can be sourced by a shell, and used by any S3 client (aws, rclone, SDKs).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).BucketCredentials, api.BucketRef{StackID: args[0], Label: args[1]})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			for _, kv := range [][2]string{{"KLOUD_BUCKET", res.Bucket}, {"AWS_ENDPOINT_URL", res.Endpoint}, {"AWS_REGION", res.Region},
				{"AWS_ACCESS_KEY_ID", res.AccessKeyID}, {"AWS_SECRET_ACCESS_KEY", res.SecretAccessKey}} {
				fmt.Fprintf(g.stdout, "export %s=%s\n", kv[0], shellQuote(kv[1]))
			}
			return nil
		},
	}

	grant := &cobra.Command{
		Use:   "grant STACK LABEL USER read|write",
		Short: "Give a member of the stack's team a key to a bucket (stack owner, team admins)",
		Args:  cobra.ExactArgs(4),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).BucketGrant, api.BucketGrantParams{
				BucketRef: api.BucketRef{StackID: args[0], Label: args[1]}, User: args[2], Access: args[3]})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "%s may %s bucket %s (kloud bucket credentials %s %s)\n", args[2], args[3], res.Bucket, args[0], args[1])
			return nil
		},
	}

	revoke := &cobra.Command{
		Use:   "revoke STACK LABEL USER",
		Short: "Take a user's key to a bucket away (stack owner, team admins)",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := call(cmd.Context(), g, (*api.Client).BucketRevoke, api.BucketRevokeParams{
				BucketRef: api.BucketRef{StackID: args[0], Label: args[1]}, User: args[2]})
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.stdout, "%s has no key to bucket %s any more\n", args[2], res.Bucket)
			return nil
		},
	}

	var retain, noRetain bool
	del := &cobra.Command{
		Use:   "delete STACK LABEL [--retain|--no-retain]",
		Short: "End a bucket claim now: delete the bucket and its data, or keep the data (--retain)",
		Long: `End a bucket claim now (stack owner, team admins). Without a flag the claim's own retain
(from its kloud_bucket block) decides; --retain keeps the bucket and its data (every key
revoked), --no-retain deletes them. The stack keeps working without the bucket; its next build
claims it again while the template declares it.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := api.BucketDeleteParams{BucketRef: api.BucketRef{StackID: args[0], Label: args[1]}}
			switch {
			case retain && noRetain:
				return fmt.Errorf("--retain or --no-retain, not both")
			case retain:
				p.Retain = new(true)
			case noRetain:
				p.Retain = new(false)
			}
			res, err := call(cmd.Context(), g, (*api.Client).BucketDelete, p)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res)
			}
			how := "deleted with its data"
			if res.Retain {
				how = "released; its data kept, its keys revoked"
			}
			fmt.Fprintf(g.stdout, "bucket %s %s\n", res.Bucket, how)
			return nil
		},
	}
	del.Flags().BoolVar(&retain, "retain", false, "keep the bucket and its data")
	del.Flags().BoolVar(&noRetain, "no-retain", false, "delete the bucket and its data")

	cmd.AddCommand(list, creds, grant, revoke, del)
	return cmd
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
