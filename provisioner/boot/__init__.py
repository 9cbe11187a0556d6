"""Boot services: the DHCP codec and server, the boot policy, TFTP and the boot HTTP server."""
