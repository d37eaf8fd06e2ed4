"""convoy.train"""
