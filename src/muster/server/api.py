"""The HTTP API at the door: the pydantic model of each shape in `muster.api`, and the
request bodies.

The response models are derived from `muster.api`'s TypedDicts (`shape`), so a shape is
spelled once and `/openapi.json` documents every response with the comments of its fields.
A view that drifts from its shape is a 500 in the tests rather than a silent change: every
model forbids keys it does not name, and names every key it has. Request bodies are
validated here, with their bounds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from muster import api as shapes
from muster.config.quotas import MAX_QUOTA_VALUE
from muster.priority import MAX_PRIORITY, MIN_PRIORITY
from muster.server.shapes import many as many
from muster.server.shapes import one_or_many as one_or_many
from muster.server.shapes import shape
from muster.states import DrillFault, ModelStage, NotificationKind, QuotaLimit

# -- responses (`muster.api`) --------------------------------------------------------------

Error = shape(shapes.Error)
SupervisorHealth = shape(shapes.SupervisorHealth)
Health = shape(shapes.Health)
Event = shape(shapes.Event)
OomView = shape(shapes.OomView)
ReplicaView = shape(shapes.ReplicaView)
DumpRankView = shape(shapes.DumpRankView)
DumpResult = shape(shapes.DumpResult)
AttemptView = shape(shapes.AttemptView)
EarlyStop = shape(shapes.EarlyStop)
TrialEnvironmentView = shape(shapes.TrialEnvironmentView)
TrialProgress = shape(shapes.TrialProgress)
RunningTrialProgress = shape(shapes.RunningTrialProgress)
TrialDetail = shape(shapes.TrialDetail)
TrialDescription = shape(shapes.TrialDescription)
TrialSummary = shape(shapes.TrialSummary)
CurveView = shape(shapes.CurveView)
ExperimentCurves = shape(shapes.ExperimentCurves)
SeriesView = shape(shapes.SeriesView)
TrialSeries = shape(shapes.TrialSeries)
ParamImportance = shape(shapes.ParamImportance)
Importance = shape(shapes.Importance)
BestSoFar = shape(shapes.BestSoFar)
Objective = shape(shapes.Objective)
FrontPoint = shape(shapes.FrontPoint)
ParetoFront = shape(shapes.ParetoFront)
SearchProgress = shape(shapes.SearchProgress)
Progress = shape(shapes.Progress)
VerdictCounts = shape(shapes.VerdictCounts)
ExperimentSummary = shape(shapes.ExperimentSummary)
ExperimentDetail = shape(shapes.ExperimentDetail)
MetricReport = shape(shapes.MetricReport)
CheckpointView = shape(shapes.CheckpointView)
ArtifactSetView = shape(shapes.ArtifactSetView)
ModelVersionView = shape(shapes.ModelVersionView)
RegisteredModelView = shape(shapes.RegisteredModelView)
MlflowExport = shape(shapes.MlflowExport)
TrialSnapshot = shape(shapes.TrialSnapshot)
SnapshotDifference = shape(shapes.SnapshotDifference)
TrialDiff = shape(shapes.TrialDiff)
DiagnosticFinding = shape(shapes.DiagnosticFinding)
TrialDiagnostics = shape(shapes.TrialDiagnostics)
ExperimentDiff = shape(shapes.ExperimentDiff)
GcPolicy = shape(shapes.GcPolicy)
GcDecision = shape(shapes.GcDecision)
GcPlan = shape(shapes.GcPlan)
DeleteAccepted = shape(shapes.DeleteAccepted)
Archived = shape(shapes.Archived)
RetentionRules = shape(shapes.RetentionRules)
RetentionLine = shape(shapes.RetentionLine)
RetentionKept = shape(shapes.RetentionKept)
RetentionPlan = shape(shapes.RetentionPlan)
LogMatch = shape(shapes.LogMatch)
LogSearchResult = shape(shapes.LogSearchResult)
Job = shape(shapes.Job)
GpuView = shape(shapes.GpuView)
FilesystemView = shape(shapes.FilesystemView)
NodeReplicaView = shape(shapes.NodeReplicaView)
NodeView = shape(shapes.NodeView)
NodeReleaseView = shape(shapes.NodeReleaseView)
ClusterStatus = shape(shapes.ClusterStatus)
EnvironmentView = shape(shapes.EnvironmentView)
PruneResultView = shape(shapes.PruneResultView)
EnvironmentsDisk = shape(shapes.EnvironmentsDisk)
BasePackageView = shape(shapes.BasePackageView)
RuntimeBaseView = shape(shapes.RuntimeBaseView)
UserView = shape(shapes.UserView)
NewUser = shape(shapes.NewUser)
TokenView = shape(shapes.TokenView)
NewToken = shape(shapes.NewToken)
Whoami = shape(shapes.Whoami)
LoginView = shape(shapes.LoginView)
AuditEvent = shape(shapes.AuditEvent)
SessionView = shape(shapes.SessionView)
QuotaUsage = shape(shapes.QuotaUsage)
QuotaLimitView = shape(shapes.QuotaLimitView)
QuotaView = shape(shapes.QuotaView)
UserQuotas = shape(shapes.UserQuotas)
GroupView = shape(shapes.GroupView)
DrillView = shape(shapes.DrillView)
DrillSummary = shape(shapes.DrillSummary)
NotificationSubscriptionView = shape(shapes.NotificationSubscriptionView)
NewNotificationSubscription = shape(shapes.NewNotificationSubscription)
NotificationView = shape(shapes.NotificationView)
UsageRow = shape(shapes.UsageRow)
UsageReport = shape(shapes.UsageReport)


# -- request bodies -----------------------------------------------------------------------

MAX_NOTE_CHARS = 10_000
_NO_NUL = r"^[^\x00]*$"  # text a database column can hold (PostgreSQL refuses NUL)
_USER_NAME = r"^[a-z_][a-z0-9_.-]{0,31}$"
_UNIX_NAME = r"^([a-z_][a-z0-9_-]{0,30}\$?)?$"
_PASSWORD = Field(min_length=1, max_length=1024, description="8 to 1024 characters")
UserName = Annotated[str, Field(min_length=1, max_length=32, pattern=_USER_NAME,
                                description="a-z, 0-9, '_', '.', '-'; at most 32")]


class GcRequest(BaseModel):
    """`POST /experiments/{id}/checkpoints/gc`: counts left out keep their value."""

    model_config = ConfigDict(strict=True)

    dry_run: bool = False
    save_trial_latest: int | None = Field(default=None, ge=0, le=1000)
    save_trial_best: int | None = Field(default=None, ge=0, le=1000)
    save_experiment_best: int | None = Field(default=None, ge=0, le=1000)


class RetentionRequest(BaseModel):
    """`POST /retention/runs`: the plan alone (`dry_run`), or the plan carried out. An
    unknown key is refused: a misspelt `dry_run` must never remove anything."""

    model_config = ConfigDict(strict=True, extra="forbid")

    dry_run: bool = False


ModelName = Annotated[str, Field(min_length=1, max_length=128,
                                 pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                 description="letters, digits and . _ -")]


class ModelCreateRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    name: ModelName
    description: Annotated[str, Field(max_length=4096, pattern=_NO_NUL)] = ""
    labels: Annotated[list[Annotated[str, Field(min_length=1, max_length=64,
                                                  pattern=_NO_NUL)]],
                      Field(max_length=32)] = []


class RegisterRequest(BaseModel):
    """`POST /models/{name}/versions`: a trial's checkpoint as the model's next version."""

    model_config = ConfigDict(strict=True)

    trial_id: Annotated[int, Field(ge=1, le=2**31 - 1)]
    checkpoint: Annotated[str | None, Field(
        min_length=1, max_length=255, pattern=_NO_NUL,
        description="its uuid or name (default: `pick`)")] = None
    pick: Literal["latest", "best"] = "latest"
    accept_unverified: Annotated[str | None, Field(
        min_length=1, max_length=1000, pattern=_NO_NUL,
        description="why a trial that was not verified is registered (an admin's)")] = None


class StageRequest(BaseModel):
    """`PUT /models/{name}/versions/{v}/stage`."""

    model_config = ConfigDict(strict=True)

    stage: Annotated[ModelStage, Field(strict=False,
                                       description="none, staging, production or archived")]


class PruneRequest(BaseModel):
    older_than: Annotated[str, Field(max_length=32, pattern=r"^[0-9a-z. ]+$",
                                     description="a duration: 7d, 12h, 30m, 0s")] = "7d"


class PriorityRequest(BaseModel):
    priority: Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY,
                                   description="1 to 99; lower runs first")]


class ReviewRequest(BaseModel):
    decision: Literal["approve", "reject"]
    note: Annotated[str, Field(min_length=1, max_length=MAX_NOTE_CHARS, pattern=_NO_NUL,
                               description="why; recorded with the decision")]
    reviewer: Annotated[str | None, Field(
        max_length=200, pattern=_NO_NUL,
        description="ignored: the review is recorded as the authenticated user's (kept so "
                    "that older clients still work)")] = None


class UserCreateRequest(BaseModel):
    name: UserName
    role: Literal["admin", "user", "viewer"] = "user"
    display_name: Annotated[str, Field(max_length=200, pattern=_NO_NUL)] = ""
    password: Annotated[str | None, _PASSWORD] = None
    unix_user: Annotated[str | None, Field(max_length=32, pattern=_UNIX_NAME)] = None


class UserEditRequest(BaseModel):
    display_name: Annotated[str | None, Field(max_length=200, pattern=_NO_NUL)] = None
    role: Literal["admin", "user", "viewer"] | None = None
    password: Annotated[str | None, _PASSWORD] = None
    current_password: Annotated[str | None, Field(
        max_length=1024, description="your current password, to change your own")] = None
    unix_user: Annotated[str | None, Field(max_length=32, pattern=_UNIX_NAME, description=(
        "the Unix account its jobs run as under `run_as: owner`; \"\" for its name"))] = None


class TokenCreateRequest(BaseModel):
    name: Annotated[str, Field(min_length=1, max_length=100, pattern=_NO_NUL)] = "api token"
    expires: Annotated[str | None, Field(
        max_length=32, pattern=r"^[0-9a-z. ]+$",
        description="a duration such as 30d or 12h (at most 3650d); none: never")] = None
    user: Annotated[str | None, Field(
        min_length=1, max_length=32, pattern=_USER_NAME,
        description="an admin makes a token for this user (a service account)")] = None


class NotificationRequest(BaseModel):
    """`POST /notifications`: where to send which of your events."""

    model_config = ConfigDict(strict=True)

    url: Annotated[str, Field(min_length=1, max_length=2048, description=(
        "https://… (muster's signed webhook) or an Apprise URL (slack://…, msteams://…, "
        "discord://…); an admin may also name env:NAME or file:/path"))]
    events: Annotated[list[Annotated[str, Field(max_length=32)]] | None, Field(
        default=None, min_length=1, max_length=len(NotificationKind), description=(
            "which notifications (experiment-ended, trial-suspect, trial-failed, "
            "trial-stalled, disk-guard, node-quarantined, model-registered, model-staged); "
            "none: all of them"))] = None


QuotaValue = Annotated[int | None, Field(
    ge=0, le=MAX_QUOTA_VALUE, description="a count (0 allows none); null: no limit")]


class QuotaSetRequest(BaseModel):
    """`PATCH /quotas/...`: the limits to set at runtime; one left out keeps what it is."""

    model_config = ConfigDict(strict=True, extra="forbid")

    max_slots: QuotaValue = None
    max_gpus: QuotaValue = None
    max_running_trials: QuotaValue = None
    max_queued_trials: QuotaValue = None

    def named(self) -> dict[QuotaLimit, int | None]:
        """The limits the body names (null ones too: "no limit" is a value)."""
        return {QuotaLimit(key): getattr(self, key) for key in self.model_fields_set}


class GroupCreateRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    name: UserName
    description: Annotated[str, Field(max_length=200, pattern=_NO_NUL)] = ""


class GroupMembersRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    users: Annotated[list[UserName], Field(min_length=1, max_length=1000)]


class LoginRequest(BaseModel):
    """A user's name and password, or an API token of theirs."""

    name: Annotated[str | None, Field(min_length=1, max_length=32)] = None
    password: Annotated[str | None, Field(min_length=1, max_length=1024)] = None
    token: Annotated[str | None, Field(min_length=1, max_length=200)] = None


class DrillRequest(BaseModel):
    """`POST /experiments/{id}/drills` ("Run a drill" on an experiment's page): the faults
    (none: every one), the scale of the planned length, the data directory where the
    config names none, and when a mid-run fault is injected."""

    model_config = ConfigDict(strict=True, extra="forbid")

    # Each a fault's word: a JSON string is no enum member, which strict mode refuses.
    faults: Annotated[list[Annotated[DrillFault, Field(strict=False)]] | None,
                      Field(max_length=len(DrillFault))] = None
    scale: Annotated[float, Field(gt=0, le=1)] = 0.1
    data: Annotated[str | None, Field(min_length=1, max_length=1024)] = None
    at: Annotated[float, Field(gt=0, lt=1)] = 0.5
