module github.com/kloud-dev/kloud/bench/webterm/gotty

go 1.26.8

require (
	github.com/NYTimes/gziphandler v1.1.1 // indirect
	github.com/cpuguy83/go-md2man/v2 v2.0.0-20190314233015-f79a8a8ca69d // indirect
	github.com/creack/pty v1.1.11 // indirect
	github.com/fatih/structs v1.1.0 // indirect
	github.com/gorilla/websocket v1.4.2 // indirect
	github.com/hashicorp/errwrap v1.0.0 // indirect
	github.com/hashicorp/go-multierror v1.1.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/russross/blackfriday/v2 v2.0.1 // indirect
	github.com/shurcooL/sanitized_anchor_name v1.0.0 // indirect
	github.com/sorenisanerd/gotty v1.5.0 // indirect
	github.com/urfave/cli/v2 v2.3.0 // indirect
	github.com/yudai/hcl v0.0.0-20151013225006-5fa2393b3552 // indirect
	golang.org/x/sys v0.0.0-20210415045647-66c3f260301c // indirect
)
