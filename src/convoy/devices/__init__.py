"""convoy.devices"""
