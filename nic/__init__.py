"""pulse.nic"""
