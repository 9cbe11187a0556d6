"""A synthetic ibnetdiscover topology file of any size (a 2-tier fat tree), for scale tests."""

from __future__ import annotations


def fat_tree(leaves: int, hosts_per_leaf: int, spines: int) -> str:
    """Leaf L port p<=hosts -> host; port hosts+s -> spine s; spine s port L -> leaf L."""
    leaf_guid = [0x200000 + i for i in range(leaves)]
    spine_guid = [0x300000 + i for i in range(spines)]
    ports = hosts_per_leaf + spines
    blocks: list[str] = []
    for index, guid in enumerate(leaf_guid):
        lines = [f'Switch\t{ports} "S-{guid:016x}"\t\t# "MF0;leaf-{index + 1:03d}:MQM9790/U1" '
                 f"enhanced port 0 lid {index + 1} lmc 0"]
        for port in range(1, hosts_per_leaf + 1):
            host = index * hosts_per_leaf + port
            lines.append(f'[{port}]\t"H-{0x1000000 + host:016x}"[1]({0x1000000 + host:x}) '
                         f'\t\t# "node{host:05d} mlx5_0" lid {1000 + host} 4xNDR')
        for s, sguid in enumerate(spine_guid):
            lines.append(f'[{hosts_per_leaf + s + 1}]\t"S-{sguid:016x}"[{index + 1}]\t\t'
                         f'# "MF0;spine-{s + 1:02d}:MQM9790/U1" lid {500 + s} 4xNDR')
        blocks.append("\n".join(lines))
    for s, sguid in enumerate(spine_guid):
        lines = [f'Switch\t{leaves} "S-{sguid:016x}"\t\t# "MF0;spine-{s + 1:02d}:MQM9790/U1" '
                 f"enhanced port 0 lid {500 + s} lmc 0"]
        lines += [f'[{i + 1}]\t"S-{guid:016x}"[{hosts_per_leaf + s + 1}]\t\t'
                  f'# "MF0;leaf-{i + 1:03d}:MQM9790/U1" lid {i + 1} 4xNDR'
                  for i, guid in enumerate(leaf_guid)]
        blocks.append("\n".join(lines))
    for host in range(1, leaves * hosts_per_leaf + 1):
        leaf, port = divmod(host - 1, hosts_per_leaf)
        blocks.append(f'Ca\t1 "H-{0x1000000 + host:016x}"\t\t# "node{host:05d} mlx5_0"\n'
                      f'[1]({0x1000000 + host:x}) \t"S-{leaf_guid[leaf]:016x}"[{port + 1}]'
                      f'\t\t# lid {1000 + host} lmc 0 "MF0;leaf-{leaf + 1:03d}:MQM9790/U1" '
                      f"lid {leaf + 1} 4xNDR")
    return "\n\n".join(blocks) + "\n"
