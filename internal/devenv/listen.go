package devenv

import "net"

// loopbackListen keeps the in-process broker off every interface but
// loopback: tests talk only to 127.0.0.1.
func loopbackListen(network, address string) (net.Listener, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		address = net.JoinHostPort("127.0.0.1", port)
	}
	return net.Listen(network, address)
}
