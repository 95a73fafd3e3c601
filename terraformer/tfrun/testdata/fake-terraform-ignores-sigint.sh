#!/bin/sh
# A fake terraform for tests. It answers `version -json`, `init` and `show -json`; on plan, apply and
# destroy it ignores SIGINT and waits on a child process forever, as a wedged terraform (or a
# provider that ignores Stop) would. Real terraform always honours SIGINT, so only a fake can show
# that the engine sends SIGKILL to the whole process group after CancelGrace.
case "$1" in
version)
	echo '{"terraform_version":"1.5.7","platform":"linux_amd64","provider_selections":{},"terraform_outdated":false}'
	;;
init)
	echo "Terraform has been successfully initialized!"
	;;
show)
	echo '{"format_version":"1.0"}'
	;;
plan | apply | destroy)
	trap '' INT
	sleep 300 &
	echo $! >child.pid
	echo '{"@level":"info","@message":"fake terraform: ignoring SIGINT","type":"log"}'
	wait
	exit 3
	;;
*)
	echo "fake terraform: unsupported command $1" >&2
	exit 1
	;;
esac
