// Package tmpl reads and rewrites Terraform stack templates (HCL .tf and JSON .tf.json files of
// one root module) without running Terraform.
//
// Start with Parse, which checks file names, UTF-8 and syntax and indexes the top-level blocks.
// A Config then answers questions kloud needs before apply:
//
//   - Resources lists managed resources (the machines of a provider are Resources(p.ResourceType));
//   - LiteralString and LiteralAttrs read attribute values that are literals (a quoted string
//     without interpolation, a heredoc, a number, a bool), which is all kloud can know without
//     evaluating the configuration;
//   - Variables, Providers and CheckSecretRefs describe what the template uses; CheckSecretRefs
//     enforces that credential variables are referenced only inside provider blocks (Koding's
//     ShadowVariables, but refusing instead of replacing), using HCL's traversal analysis
//     (Expression.Variables) for both syntaxes, so "$${var.x}" escapes and for-expression
//     iterators are told apart from real references;
//   - Validate applies kloud's own rules to machine resources (count, never for_each; literal
//     user data);
//   - Params (params.go) reads the typed parameters (variable blocks, with kloud_parameter
//     metadata) and presets (kloud_preset); Params.Resolve checks values against them with the
//     variables' validation conditions, evaluated with HCL and Functions (funcs.go);
//   - CheckPolicy (policy.go) applies the template policy: templates are data, not code (an
//     allowlist of blocks, providers and pure functions; no provisioners, host paths, backends or
//     modules), see docs/template-policy.md.
//
// and rewrites it:
//
//   - SetUserData points a machine's user data attribute at a variable, var.<name>[count.index]
//     for a resource with count and var.<name> otherwise, so the per-machine cloud-init (each with
//     its own kite key) reaches Terraform as a variable value and never as template text;
//   - DeclareVariable declares such variables in a generated file (GeneratedFile), leaving the
//     user's files untouched.
//
// Files returns the result.
//
// Differences from the first sketch of this API, and why:
//
//   - Rewrites splice bytes at the source ranges the HCL parsers report instead of going through
//     hclwrite (HCL) or re-marshalling the resource (JSON). Everything outside the replaced
//     expression stays byte-for-byte (comments, alignment, key order), and this package does not
//     need hclwrite's extra module dependency. hclwrite also realigns neighbouring attributes and
//     breaks single-line blocks when adding an attribute.
//   - The user data attribute can be "attr" or "attr.key" for a key of an object-valued
//     attribute, such as Google's metadata.user-data or terraform_data's input.user_data.
//   - DeclareVariable returns an error: for an invalid name or type, or when a user file already
//     declares the variable in a way that conflicts with it (a secret must be sensitive).
//   - Validate takes the machine resource types with their user data attributes. File name
//     checks (extensions, case-insensitive duplicates, override and ignored files,
//     subdirectories) and UTF-8 are Parse errors. Parse accepts a GeneratedFile holding only
//     variable declarations, so kloud's output parses again. Duplicate resource and variable
//     declarations are also Parse errors, because every lookup here assumes they are unique.
//
// Limits:
//
//   - Only the root module's files are read. Module arguments are checked for secrets, but the
//     modules themselves are not read; .tfvars, template files (templatefile) and override files
//     are refused by Parse.
//   - Kloud cannot evaluate expressions: user data built with interpolation, templatefile or
//     file is refused by Validate, and LiteralAttrs leaves such attributes out.
//   - CheckSecretRefs allows a secret in any provider block. A provider can still expose what it
//     is given (AWS default_tags copies into resources; an invalid region is quoted in an error
//     message), and the check does not know which provider a secret belongs to.
//
// Errors about the template name the place as file:line:col. Parse returns *ParseError values
// and CheckSecretRefs *SecretRefError values, several joined with errors.Join; errors.As finds
// them. A Config is not safe for concurrent use.
package tmpl
