"""OS configuration with Ansible: ``base`` (events, composition), ``events`` (runner events
and outcomes, pure), ``workdir`` (private data dirs), ``ansible`` (ansible-runner; the only
module importing it), ``installer`` (``AnsibleInstaller``: the ``configuring`` step and the
``kubeadm join`` hook)."""
