// Command coredns is the cluster DNS of the tests' real node: CoreDNS of the
// release go.mod requires, with only the plugins a cluster's DNS uses (no
// upstream, so no forward). CoreDNS's own main imports every plugin
// (core/plugin/zplugin.go) and orders them by plugin.cfg
// (core/dnsserver/zdirectives.go); here both lists are the thirteen below:
// kubeadm's Corefile without forward, plus bind, and the three the kubernetes
// plugin links in anyway (metadata, prometheus, transfer), so that what
// `coredns -plugins` lists is what a Corefile may use. ../build.sh builds it.
package main

import (
	"log"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metadata"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/transfer"
)

// directives is plugin.cfg's order (the order a query passes the plugins),
// kept to the plugins imported above.
var directives = []string{
	"metadata",
	"reload",
	"bind",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"transfer",
	"kubernetes",
	"loop",
}

func main() {
	if err := dnsserver.SetDirectives(directives); err != nil {
		log.Fatalf("coredns: the plugin order is wrong: %v", err)
	}
	coremain.Run()
}
