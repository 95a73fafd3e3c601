//go:build tools

// Package gotty pins gotty, the baseline of bench/webterm; bench/webterm builds it from here
// (go build github.com/sorenisanerd/gotty). Its code is not in this repository.
package gotty

import _ "github.com/sorenisanerd/gotty"
