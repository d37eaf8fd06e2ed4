"""convoy.plan"""
