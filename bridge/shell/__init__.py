"""What every long-running service composes (issue 32): the state directory, taken and watched.

A layer below the services, none of them: the agent, the approver, the console and Azure's channel
each take their state directory here instead of reaching into one another's code.
"""
