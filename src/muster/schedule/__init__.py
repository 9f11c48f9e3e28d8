"""Who runs where: the queue's pure admission plan, the GPUs (inventory and store), the
disk gate."""
