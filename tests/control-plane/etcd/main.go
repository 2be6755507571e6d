// Command etcd is the etcd server of the release go.mod requires, built as an
// ordinary Go module (etcd's own server module points its siblings at local
// paths, so `go install` refuses it). build.sh builds it; the tests' harness
// (tests/src/control_plane.rs) runs it under kube-apiserver.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
