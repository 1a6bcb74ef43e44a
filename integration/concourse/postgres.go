package concourse

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// EnvPostgresBinDir names the folder of PostgreSQL's initdb, postgres and
// createdb; by default the newest /usr/lib/postgresql/<version>/bin,
// where Debian's postgresql package puts them (`make tools` installs it).
const EnvPostgresBinDir = "JETWAY_POSTGRES_BIN_DIR"

// pgPort only names the socket file (.s.PGSQL.<port>): the cluster
// listens on no TCP port, only on a socket in its own folder, so two
// harnesses never collide and nothing is left listening.
const pgPort = "5432"

// postgres is a private PostgreSQL cluster in a folder of its own, for one
// web node.
type postgres struct {
	socketDir string
	proc      *process
}

// postgresBinDir finds initdb, postgres and createdb.
func postgresBinDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv(EnvPostgresBinDir)
	}
	if dir == "" {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
		sort.Slice(found, func(i, j int) bool { return pgVersion(found[i]) > pgVersion(found[j]) })
		if len(found) == 0 {
			return "", fmt.Errorf("%w: PostgreSQL's initdb is not in /usr/lib/postgresql/*/bin: `make tools` installs Debian's postgresql, or set %s", ErrMissing, EnvPostgresBinDir)
		}
		dir = filepath.Dir(found[0])
	}
	for _, name := range []string{"initdb", "postgres", "createdb"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%w: PostgreSQL's %s is not in %s (%s)", ErrMissing, name, dir, EnvPostgresBinDir)
		}
	}
	return dir, nil
}

// pgVersion is the major version in /usr/lib/postgresql/<version>/bin/initdb.
func pgVersion(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

// postgresUser is whom PostgreSQL runs as: it refuses to run as root, so
// as Debian's postgres user then, else as the test's own user (nil).
func postgresUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: PostgreSQL cannot run as root and there is no postgres user (Debian's postgresql package makes it): %v", ErrMissing, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// startPostgres makes a cluster in dir, starts it and creates the database
// db. The cluster trusts every local connection and, being thrown away,
// never syncs to disk.
func startPostgres(ctx context.Context, binDir, dir, db string) (*postgres, error) {
	cred, err := postgresUser()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	env := []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), "-D", data,
		"-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir, initdb.Env = dir, env
	initdb.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w:\n%s", err, indent(string(out)))
	}
	proc, err := startProcess("postgres", filepath.Join(dir, "postgres.log"), filepath.Join(binDir, "postgres"),
		[]string{"-D", data, "-k", dir, "-p", pgPort, "-c", "listen_addresses=",
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"},
		env, cred)
	if err != nil {
		return nil, err
	}
	pg := &postgres{socketDir: dir, proc: proc}
	if err := pg.createDB(ctx, binDir, db); err != nil {
		pg.stop()
		return nil, err
	}
	return pg, nil
}

// createDB creates db once the server accepts connections.
func (pg *postgres) createDB(ctx context.Context, binDir, db string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err := exec.CommandContext(ctx, filepath.Join(binDir, "createdb"),
			"-h", pg.socketDir, "-p", pgPort, "-U", "postgres", db).CombinedOutput()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create database %s: %w (last: %s)", db, ctx.Err(), out)
		case <-pg.proc.done:
			return fmt.Errorf("postgres exited; last log lines:\n%s", indent(pg.proc.logTail(20)))
		case <-tick.C:
		}
	}
}

// stop shuts PostgreSQL down as `pg_ctl stop -m fast` does (SIGINT: roll
// back open transactions, end the backends, checkpoint), and kills it if
// that takes over 10 s.
func (pg *postgres) stop() {
	if pg != nil {
		pg.proc.stop(syscall.SIGINT, 10*time.Second)
	}
}
