"""Length, verify and schedule policies (docs/architecture.md, "The contract between engines, loop and policies").

Importing this package registers every built-in policy; `build_length/verify/schedule(name, **params)`
construct one by registry name. Policies never import engines.
"""

from autospec.policies import (  # noqa: F401
                               adaedl,
                               adaspec,
                               batch_schedule,
                               dsde,
                               dspark,
                               fcfs,
                               gp_lcb,
                               laps_sd,
                               las,
                               lp_sjf,
                               oracle,
                               oracle_m,
                               smartspec,
                               static,
                               threshold,
                               verify_all,
)
from autospec.policies.base import (
                               LENGTH_POLICIES,
                               SCHEDULE_POLICIES,
                               VERIFY_POLICIES,
                               LengthPolicy,
                               Pick,
                               PolicyParams,
                               SchedulePolicy,
                               VerifyPolicy,
                               build_length,
                               build_policy,
                               build_schedule,
                               build_verify,
                               policy_class,
                               register_length,
                               register_schedule,
                               register_verify,
)

__all__ = [
    "LENGTH_POLICIES", "VERIFY_POLICIES", "SCHEDULE_POLICIES", "LengthPolicy", "VerifyPolicy",
    "SchedulePolicy", "Pick", "PolicyParams", "build_length", "build_verify", "build_schedule",
    "build_policy", "policy_class", "register_length", "register_verify", "register_schedule",
]
