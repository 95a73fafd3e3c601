package userdata

// CloudInitStages is a Python program that runs cloud-init's four boot stages (init --local,
// init, modules --mode=config, modules --mode=final) in one Python process: the machine's PID 1
// of the local and docker providers runs it instead of four `cloud-init` processes. cloud-init
// stays real, each stage is what `cloud-init <stage>` runs (cloudinit.cmd.main.main with the
// same arguments), and the user's script still runs through it (scripts-user, runcmd); what is
// saved is importing cloud-init four times (0.2-0.5 s of CPU each on a 2-core guest: requests,
// jinja2 and jsonschema come with it) and the entry point's package-metadata scan.
//
// cloud-init parses YAML with PyYAML's pure-Python SafeLoader (cloudinit.safeyaml.load), and a
// boot parses some 70 documents: /etc/cloud/cloud.cfg and cloud.cfg.d are read again for every
// stage and path lookup. In a profile of a local machine's boot that was half of the Python
// interpreter's function calls (1.84 million in all; 0.86 million with libyaml). The program gives
// safeyaml.load the same loader on PyYAML's libyaml parser (yaml.CSafeLoader, with cloud-init's
// one extra constructor, python/unicode), when the image's PyYAML has it; the schema
// annotations' loader with marks is left alone. It logs which parser cloud-init uses.
//
// Each stage sends its output through a tee (cloud-init's "output" setting, "| tee -a
// /var/log/cloud-init-output.log"), which cloud-init starts with a preexec_fn through a shell:
// a full fork of the Python process, 44 ms of CPU per stage on this host against 6.5 ms for a
// tee spawned without one (vfork). For that exact setting the program spawns tee itself, with
// the same umask (037) and, creating the log, the same group (adm); any other setting is
// cloud-init's own. It logs which.
//
// Run it as `python3 -c CloudInitStages PREFIX`: it prints "<UTC time> PREFIX: cloud-init
// <stage>" before and "...: exit N after T" after each stage on its standard output, as the
// providers' boot logs did for the four processes. A stage's output redirection (cloud-init's
// "output" setting: a tee into /var/log/cloud-init-output.log) is undone after the stage, as
// its process's exit did, so that every stage has its own. It exits StagesUnavailable, having
// run nothing, when cloud-init's Python module cannot be imported (the caller then runs the
// four `cloud-init` commands), and 0 otherwise: stage failures are in cloud-init's own status
// (/run/cloud-init/status.json, result.json), which the providers read.
const CloudInitStages = `
import datetime, os, sys, time
prefix = sys.argv[1] if len(sys.argv) > 1 else "kloud-stages"
def log(msg):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    print("%s %s: %s" % (now, prefix, msg), flush=True)
try:
    from cloudinit.cmd.main import main
except Exception as e:
    log("cannot import cloud-init (%s: %s): running its stages as commands" % (type(e).__name__, e))
    sys.exit(3)
try:
    import yaml
    from cloudinit import safeyaml
    class _CSafeLoader(yaml.CSafeLoader):
        def construct_python_unicode(self, node):
            return self.construct_scalar(node)
    _CSafeLoader.add_constructor("tag:yaml.org,2002:python/unicode",
                                 _CSafeLoader.construct_python_unicode)
    safeyaml._CustomSafeLoader = _CSafeLoader
    log("cloud-init's YAML parser: libyaml")
except Exception as e:
    log("cloud-init's YAML parser: its own (%s: %s)" % (type(e).__name__, e))
try:
    import grp, re, subprocess
    from cloudinit import util as _util
    _redirect = _util.redirect_output
    def _spawned_tee(outfmt, errfmt, o_out=None, o_err=None):
        m = re.fullmatch(r"\| *tee -a (/[\w./-]+)", outfmt or "")
        if not m or errfmt != outfmt or _util.is_true(os.environ.get("_CLOUD_INIT_SAVE_STDOUT")):
            return _redirect(outfmt, errfmt, o_out, o_err)
        path = m.group(1)
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            try:
                os.fchown(fd, -1, grp.getgrnam("adm").gr_gid)
            except KeyError:
                pass
            os.close(fd)
        proc = subprocess.Popen(["tee", "-a", path], stdin=subprocess.PIPE, umask=0o037)
        os.dup2(proc.stdin.fileno(), (o_out or sys.stdout).fileno())
        os.dup2(proc.stdin.fileno(), (o_err or sys.stderr).fileno())
    _util.redirect_output = _spawned_tee
    log("cloud-init's output: tee spawned without a fork of python")
except Exception as e:
    log("cloud-init's output: as cloud-init spawns it (%s: %s)" % (type(e).__name__, e))
for stage in (["init", "--local"], ["init"], ["modules", "--mode=config"], ["modules", "--mode=final"]):
    name = " ".join(stage)
    log("cloud-init " + name)
    saved = (os.dup(1), os.dup(2))
    t0 = time.monotonic()
    try:
        rc = main(["cloud-init"] + stage)
    except SystemExit as e:
        rc = e.code
    except BaseException as e:
        rc = "%s: %s" % (type(e).__name__, e)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.close(saved[0])
    os.close(saved[1])
    log("cloud-init %s: exit %s after %.3fs" % (name, 0 if rc is None else rc, time.monotonic() - t0))
`

// StagesUnavailable is CloudInitStages' exit code when cloud-init's Python module is missing
// (the program's sys.exit(3); TestCloudInitStagesUnavailable runs it).
const StagesUnavailable = 3
