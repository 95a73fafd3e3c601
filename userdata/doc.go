// Package userdata renders the cloud-init user data that turns a fresh Linux VM into a Kloud
// machine: it creates the owner, writes the machine's kite key, downloads, verifies and starts
// klient, and then runs the template author's own user data.
//
// Start reading at [Render] (render.go); the merge rules are in merge.go, the generated shell
// script in provision.go, and what the machine reports back (marker lines, status files) in
// status.go.
//
// # Input
//
// [Config] carries the owner, hostname, kite key, kontrol and klient URLs, the klient checksum, the
// template's user_data and optional provider keys ([Config.Extra]). [Render] validates it (clear
// errors wrapping [ErrInvalid]) and returns "#cloud-config\n" followed by YAML with sorted keys, so
// the same Config always gives the same bytes.
//
// # Contract (what other parts rely on)
//
// The rendered #cloud-config has:
//
//   - users: one entry for the owner: shell /bin/bash, lock_passwd true, sudo
//     "ALL=(ALL) NOPASSWD:ALL" (a string: cloud-init 22.4 rejects the list form). The distro's
//     default user is not created unless a provider or the user adds "default" to users.
//   - hostname: Config.Hostname, when set (otherwise the datasource's local-hostname wins).
//   - output: all output also goes to /var/log/cloud-init-output.log (the console log kloud reads).
//   - write_files: /etc/kloud/kite.key (0400, root:root, the JWT exactly as given, no newline
//     added), /var/lib/kloud/provision.sh (0755), and /var/lib/kloud/user-script.sh (0755, base64)
//     when the user data is a script.
//   - runcmd: [[/var/lib/kloud/provision.sh]] first; runcmd entries from Extra and the user follow.
//
// provision.sh (bash, set -Eeuo pipefail) writes everything to stdout (so it lands in
// /var/log/cloud-init-output.log) and to /var/log/kloud/provision.log, and:
//
//  1. download: fetches Config.KlientURL with curl (no redirects, http/https only, connect timeout
//     10 s, 8 attempts with backoff 1, 2, 4, 8, 16, 30, 30 s) into a temp file next to the binary;
//  2. verify: checks its sha256 against Config.KlientSHA256;
//  3. install: renames it to /opt/kloud/bin/klient (0755);
//  4. start-klient: writes /var/lib/kloud/run-klient.sh, which runs
//     /opt/kloud/bin/klient --kite-key /etc/kloud/kite.key --kontrol-url <KontrolURL>
//     as root (the owner is the key's: klient.adopt hands the machine to another owner by a new
//     key and a restart with the same arguments) with output appended to /var/log/kloud/klient.log. With systemd (/run/systemd/system
//     exists) it installs /etc/systemd/system/kloud-klient.service (Restart=always;
//     KillMode=process, so stopping klient leaves the holders of its terminal sessions), enables and
//     (re)starts it. Without systemd it starts /var/lib/kloud/start-klient.sh, which launches a tiny
//     restart loop with setsid nohup (pid in /run/kloud/klient-supervisor.pid, the process group
//     leader of the loop and klient; terminal session holders run in sessions of their own and
//     outlive both), and installs the same starter as a cloud-init per-boot script
//     (/var/lib/cloud/scripts/per-boot/kloud-klient.sh) so klient comes back after a reboot;
//  5. user-script: if there is one, runs /var/lib/kloud/user-script.sh as root (cwd /, stdin
//     /dev/null, KLOUD_OWNER and KLOUD_KONTROL_URL exported, HOME=/root if unset), output
//     appended to /var/log/kloud/user-script.log and
//     copied to stdout; /var/lib/kloud/user-script.status holds [UserScriptStatus] as JSON
//     ("running" is written before it starts);
//  6. done.
//
// Each step prints marker lines, so the console log alone shows where provisioning stopped:
//
//	KLOUD-PROVISION step=<download|verify|install|start-klient|user-script|done> status=<start|ok|failed> [detail="..."]
//
// detail is a JSON string. /var/lib/kloud/provision.status always holds the last marker as
// [ProvisionStatus] JSON. [ParseMarkers] reads markers back from a log. A failed step prints
// status=failed and the script exits non-zero; an unexpected command failure is reported as
// status=failed of the current step. A failing user script is reported as
// "user-script status=failed" and "done status=failed"; provision.sh then exits with the
// script's exit code (so cloud-init reports status "error", as it does for any failing user
// script), while klient keeps running.
//
// # User data
//
// The template author's user_data is classified the way cloud-init does (leading whitespace
// ignored, prefix compared case-insensitively):
//
//   - "" adds nothing;
//   - "#cloud-config" is parsed (YAML 1.1 booleans such as yes/no/on/off are read as cloud-init
//     reads them) and merged into kloud's config with [Merge] (base, then Extra, then the user);
//   - "#include", "#include-once", "#cloud-config-archive", "#cloud-config-jsonp",
//     "#cloud-boothook", "#part-handler", "#upstart-job", "## template: jinja", MIME multipart
//     ("Content-Type:") and gzip data are rejected with an error wrapping [ErrInvalid]: kloud
//     builds one #cloud-config document and cannot honour them. A #cloud-config carrying merge_how
//     or merge_type is rejected too, since the merge rules here are fixed;
//   - anything else is a script: it is stored as user-script.sh and run by provision.sh after
//     klient has started. A script without "#!" runs with /bin/bash.
//
// # Merge rules
//
// Maps merge recursively, lists concatenate (so runcmd entries always run after provision.sh),
// and list items that are maps with the same "name" are merged (e.g. adding groups or ssh keys to
// the owner). Conflicting scalars, a type mismatch, and two write_files entries with the same path
// are errors wrapping [ErrMerge] that name the key path and both values. A null value counts as
// absent. On top of that, Extra and the user may not write files under kloud's own directories
// (/etc/kloud, /var/lib/kloud, /opt/kloud, /var/log/kloud, /run/kloud) or its systemd unit. These
// rules guard against mistakes, not malice: the owner is root on the machine anyway.
package userdata
