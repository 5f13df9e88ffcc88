<#
.SYNOPSIS
  Install or upgrade the Scheduled Events bridge (agent + optional approver) as Windows services.

.DESCRIPTION
  The Windows counterpart of deploy/linux/install.sh, run by the Custom Script extension
  (deploy/vm-extension.bicep) or by hand from an elevated PowerShell 5.1+. Idempotent: a second run
  upgrades the package in place, keeps the state directories, and keeps config.toml unless
  -ForceConfig is given.

    1. finds a Python >= 3.11 (or installs one from -PythonInstallerUrl, checked with
       -PythonInstallerSha256) into "$InstallRoot\python";
    2. creates or reuses the virtual environment "$InstallRoot\venv" and installs the package;
    3. writes the secrets and renders "$DataRoot\config.toml" with the same program as the Linux
       installer (validated by the installed package's own settings table);
    4. compiles a small service host (se-bridge-service.exe, C# from this script: no third-party
       service wrapper to download) and registers the services se-bridge-agent and
       se-bridge-approver, each running as its own virtual account (NT SERVICE\<name>), restarted by
       the service control manager 5 s after any exit (the Windows form of Restart=always).

  How the services run: se-bridge-service.exe starts "<venv>\Scripts\se-bridge.exe agent --config
  <DataRoot>\config.toml" in a hidden console, loads "<DataRoot>\environment" into its environment,
  appends its JSON log lines to "<DataRoot>\logs\<service>.log", and on Stop sends CTRL+C to that
  console (the agent treats it like SIGTERM: it stops polling, delivers what is queued and exits),
  killing it after 30 s. When the child exits on its own the host exits with an error, and the
  service recovery actions start it again.

  ACLs: "$DataRoot" is readable by SYSTEM, Administrators and the two service accounts only; the
  state directories are writable by their own service only.

  Logs: "<DataRoot>\logs\<service>.log" is rotated at 10 MB (5 generations kept); error and critical
  lines and the child's unexpected exits also go to the Application event log (source = the service
  name, registered here).

  Secrets: never on this script's command line from the VM extension (process-creation auditing
  records command lines): -SecretsUri names a Key Vault secret holding the secrets JSON, read with the
  VM's managed identity (-IdentityClientId for a user-assigned one). -SecretsFile and -SecretsB64 (or
  the SE_BRIDGE_INSTALL_SECRETS_B64 variable) are for hands-on runs. Keys and connection strings may
  also stay in Key Vault for good: the services read https://<vault>/secrets/<name> references.

  Offline: -PythonExe (a Python >= 3.11 you supply, e.g. the embeddable distribution with pip) and
  -NoIndex -FindLinks <wheelhouse> (pip download scheduled-events-bridge[eventhubs,keyvault] -d
  <wheelhouse> on a connected machine) install without reaching the internet.
#>
[CmdletBinding()]
param(
    [string]$Wheel = '',
    [string]$Package = 'scheduled-events-bridge',
    [string]$Extras = 'eventhubs,keyvault',
    [string]$IndexUrl = '',
    [string[]]$FindLinks = @(),
    [switch]$NoIndex,
    [string]$SettingsB64 = $env:SE_BRIDGE_INSTALL_SETTINGS_B64,
    [string]$SettingsFile = '',
    [string]$SecretsB64 = $env:SE_BRIDGE_INSTALL_SECRETS_B64,
    [string]$SecretsFile = '',
    [string]$SecretsUri = '',
    [string]$IdentityClientId = '',
    [switch]$ForceConfig,
    [switch]$NoStart,
    [string]$InstallRoot = (Join-Path $env:ProgramFiles 'se-bridge'),
    [string]$DataRoot = (Join-Path $env:ProgramData 'se-bridge'),
    [string]$PythonExe = '',
    [string]$PythonInstallerUrl = 'https://www.python.org/ftp/python/3.12.8/python-3.12.8-amd64.exe',
    [string]$PythonInstallerSha256 = ''
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
[Net.ServicePointManager]::SecurityProtocol = [Net.SecurityProtocolType]::Tls12


# The service host: a Windows service must answer the service control manager, which a console
# program (se-bridge.exe) does not, so this small host runs it as a child and translates Stop into
# CTRL+C (the agent's SIGINT handling: stop polling, deliver what is queued, exit 0).
$ServiceHostSource = @'
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Runtime.InteropServices;
using System.ServiceProcess;
using System.Text;

public static class SeBridgeServiceHost
{
    public static void Main(string[] args)
    {
        // args: <agent|approver> <DataRoot>
        ServiceBase.Run(new SeBridgeService(args[0], args[1]));
    }
}

public class SeBridgeService : ServiceBase
{
    [DllImport("kernel32.dll", SetLastError = true)] static extern bool AllocConsole();
    [DllImport("kernel32.dll", SetLastError = true)] static extern bool GenerateConsoleCtrlEvent(uint ctrlEvent, uint processGroupId);
    [DllImport("kernel32.dll", SetLastError = true)] static extern bool SetConsoleCtrlHandler(IntPtr handler, bool add);

    readonly string command;
    readonly string dataRoot;
    readonly object logLock = new object();
    Process child;
    volatile bool stopping;
    StreamWriter log;

    public SeBridgeService(string command, string dataRoot)
    {
        this.command = command;
        this.dataRoot = dataRoot;
        ServiceName = "se-bridge-" + command;
        CanStop = true;
        CanShutdown = true;
        AutoLog = true;
    }

    protected override void OnStart(string[] args)
    {
        string installRoot = AppDomain.CurrentDomain.BaseDirectory;
        string exe = Path.Combine(installRoot, "venv", "Scripts", "se-bridge.exe");
        string config = Path.Combine(dataRoot, "config.toml");
        log = OpenLog(Path.Combine(dataRoot, "logs", ServiceName + ".log"));
        AllocConsole();  // a hidden console of our own, shared with the child, for CTRL+C on Stop
        var info = new ProcessStartInfo(exe, command + " --config \"" + config + "\"");
        info.UseShellExecute = false;
        info.CreateNoWindow = false;
        info.RedirectStandardError = true;
        info.RedirectStandardOutput = true;
        foreach (var pair in ReadEnvironment(Path.Combine(dataRoot, "environment")))
        {
            info.EnvironmentVariables[pair.Key] = pair.Value;
        }
        child = new Process();
        child.StartInfo = info;
        child.EnableRaisingEvents = true;
        child.ErrorDataReceived += (s, e) => Log(e.Data);
        child.OutputDataReceived += (s, e) => Log(e.Data);
        child.Exited += (s, e) =>
        {
            if (!stopping)
            {
                Log("se-bridge-service: " + ServiceName + " exited with " + child.ExitCode + "; the service recovery restarts it");
                Environment.Exit(1);
            }
        };
        child.Start();
        child.BeginErrorReadLine();
        child.BeginOutputReadLine();
    }

    protected override void OnStop() { StopChild(); }

    protected override void OnShutdown() { StopChild(); }

    void StopChild()
    {
        stopping = true;
        if (child == null || child.HasExited) return;
        SetConsoleCtrlHandler(IntPtr.Zero, true);  // this host ignores the CTRL+C it sends
        GenerateConsoleCtrlEvent(0, 0);            // CTRL_C_EVENT to every process of the console
        if (!child.WaitForExit(30000))
        {
            Log("se-bridge-service: " + ServiceName + " did not stop within 30 s; killing it");
            child.Kill();
            child.WaitForExit();
        }
        SetConsoleCtrlHandler(IntPtr.Zero, false);
    }

    // The log file is rotated by size (what logrotate does on Linux): at MaxLogBytes it becomes .1,
    // .1 becomes .2 ... and the oldest of LogGenerations is dropped. Errors and the child's exits also
    // go to the Application event log (source = the service name, registered by the installer), where
    // Windows monitoring looks; the JSON lines carry "level": "error" / "critical".
    const long MaxLogBytes = 10L * 1024 * 1024;
    const int LogGenerations = 5;

    void Log(string line)
    {
        if (line == null) return;
        lock (logLock)
        {
            log.WriteLine(line);
            if (log.BaseStream.Length >= MaxLogBytes) RotateLog();
        }
        if (line.Contains("\"level\": \"error\"") || line.Contains("\"level\":\"error\"")
            || line.Contains("\"level\": \"critical\"") || line.Contains("\"level\":\"critical\"")
            || line.StartsWith("se-bridge-service:"))
        {
            WriteEvent(line, EventLogEntryType.Error);
        }
    }

    void RotateLog()
    {
        string path = Path.Combine(dataRoot, "logs", ServiceName + ".log");
        log.Dispose();
        try
        {
            string oldest = path + "." + LogGenerations;
            if (File.Exists(oldest)) File.Delete(oldest);
            for (int i = LogGenerations - 1; i >= 1; i--)
            {
                if (File.Exists(path + "." + i)) File.Move(path + "." + i, path + "." + (i + 1));
            }
            File.Move(path, path + ".1");
        }
        catch (IOException) { }  // a reader holds a file: keep appending, rotate at the next line
        log = OpenLog(path);
    }

    static StreamWriter OpenLog(string path)
    {
        var writer = new StreamWriter(new FileStream(path, FileMode.Append, FileAccess.Write,
            FileShare.ReadWrite | FileShare.Delete), new UTF8Encoding(false));
        writer.AutoFlush = true;
        return writer;
    }

    void WriteEvent(string text, EventLogEntryType type)
    {
        try { System.Diagnostics.EventLog.WriteEntry(ServiceName, text.Length > 30000 ? text.Substring(0, 30000) : text, type); }
        catch (Exception) { }  // an unregistered source or a full log must not stop the service
    }

    // NAME="value" lines with \\, \" and \n escapes, as the installer writes them.
    static IEnumerable<KeyValuePair<string, string>> ReadEnvironment(string path)
    {
        if (!File.Exists(path)) yield break;
        foreach (string raw in File.ReadAllLines(path))
        {
            int eq = raw.IndexOf('=');
            if (eq <= 0) continue;
            string value = raw.Substring(eq + 1);
            if (value.Length >= 2 && value[0] == '"' && value[value.Length - 1] == '"')
            {
                var sb = new StringBuilder();
                for (int i = 1; i < value.Length - 1; i++)
                {
                    char c = value[i];
                    if (c == '\\' && i + 1 < value.Length - 1)
                    {
                        char n = value[++i];
                        sb.Append(n == 'n' ? '\n' : n);
                    }
                    else sb.Append(c);
                }
                value = sb.ToString();
            }
            yield return new KeyValuePair<string, string>(raw.Substring(0, eq), value);
        }
    }
}
'@

function Write-Step([string]$Message) { Write-Host "se-bridge-install: $Message" }

# The install secrets from Key Vault (-SecretsUri): a token for the vault from IMDS with the VM's
# managed identity (IMDS never through a proxy), then the secret. Nothing secret is on a command line
# (process-creation auditing records command lines) or in the extension's public settings.
function Get-KeyVaultSecret([string]$Uri, [string]$ClientId) {
    $u = [Uri]$Uri
    if ($u.Scheme -ne 'https' -or $u.AbsolutePath -notmatch '^/secrets/[0-9A-Za-z-]{1,127}(/[0-9A-Za-z]{1,64})?/?$') {
        throw "se-bridge-install: -SecretsUri must be https://<vault>/secrets/<name>[/<version>]"
    }
    $resource = 'https://' + $u.Host.Substring($u.Host.IndexOf('.') + 1)  # vault.azure.net, sovereign alike
    $tokenUrl = 'http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01&resource=' +
        [Uri]::EscapeDataString($resource)
    if ($ClientId) { $tokenUrl += "&client_id=$ClientId" }
    $imds = New-Object System.Net.WebClient
    $imds.Proxy = $null
    $imds.Headers.Add('Metadata', 'true')
    $token = ($imds.DownloadString($tokenUrl) | ConvertFrom-Json).access_token
    $vault = New-Object System.Net.WebClient
    $vault.Headers.Add('Authorization', "Bearer $token")
    $secret = $vault.DownloadString("https://$($u.Authority)$($u.AbsolutePath)?api-version=7.4") | ConvertFrom-Json
    if (-not $secret.value) { throw "se-bridge-install: the Key Vault secret $($u.AbsolutePath) is empty" }
    return [string]$secret.value
}

function Invoke-Native([string]$Exe, [string[]]$Arguments, [string]$What) {
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) { throw "se-bridge-install: $What failed (exit $LASTEXITCODE)" }
}

function Test-Python([string]$Exe) {
    if (-not $Exe) { return $false }
    try {
        & $Exe -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>$null
        return ($LASTEXITCODE -eq 0)
    } catch { return $false }
}

# -- 1. Python ----------------------------------------------------------------------------------------
$bundled = Join-Path $InstallRoot 'python\python.exe'
if (-not (Test-Python $PythonExe)) {
    $PythonExe = ''
    foreach ($candidate in @($bundled, 'py -3.13', 'py -3.12', 'py -3.11', 'python')) {
        if ($candidate -like 'py *') {
            $launcher = Get-Command py -ErrorAction SilentlyContinue
            if (-not $launcher) { continue }
            $exe = & py $candidate.Substring(3) -c 'import sys; print(sys.executable)' 2>$null
        } elseif (Test-Path $candidate) {
            $exe = $candidate
        } else {
            $cmd = Get-Command $candidate -ErrorAction SilentlyContinue
            $exe = if ($cmd) { $cmd.Source } else { '' }
        }
        if (Test-Python $exe) { $PythonExe = $exe; break }
    }
}
if (-not $PythonExe) {
    Write-Step "no Python >= 3.11 found; installing one into $InstallRoot\python"
    $installer = Join-Path $env:TEMP 'se-bridge-python-installer.exe'
    Invoke-WebRequest -UseBasicParsing -Uri $PythonInstallerUrl -OutFile $installer
    if ($PythonInstallerSha256) {
        $hash = (Get-FileHash -Algorithm SHA256 $installer).Hash
        if ($hash -ne $PythonInstallerSha256.ToUpperInvariant()) { throw "Python installer hash $hash does not match" }
    }
    $process = Start-Process -FilePath $installer -Wait -PassThru -ArgumentList @(
        '/quiet', 'InstallAllUsers=1', 'PrependPath=0', 'Include_test=0', 'Include_launcher=0',
        'Include_doc=0', 'Shortcuts=0', "TargetDir=$InstallRoot\python")
    Remove-Item $installer -Force
    if ($process.ExitCode -ne 0) { throw "Python installer failed (exit $($process.ExitCode))" }
    $PythonExe = $bundled
}
Write-Step "using $PythonExe"

# -- directories and ACLs -----------------------------------------------------------------------------
$services = @('se-bridge-agent', 'se-bridge-approver')
$stateDirs = @{ 'se-bridge-agent' = (Join-Path $DataRoot 'state'); 'se-bridge-approver' = (Join-Path $DataRoot 'approver-state') }
$logs = Join-Path $DataRoot 'logs'
foreach ($dir in @($InstallRoot, $DataRoot, $logs) + $stateDirs.Values) {
    if (-not (Test-Path $dir)) { New-Item -ItemType Directory -Path $dir | Out-Null }
}
function Set-PrivateAcl([string]$Path, [string[]]$Readers, [string[]]$Writers) {
    $acl = New-Object System.Security.AccessControl.DirectorySecurity
    $acl.SetAccessRuleProtection($true, $false)  # no inheritance from ProgramData (Users may read there)
    $inherit = [System.Security.AccessControl.InheritanceFlags]'ContainerInherit, ObjectInherit'
    $none = [System.Security.AccessControl.PropagationFlags]::None
    foreach ($who in @('NT AUTHORITY\SYSTEM', 'BUILTIN\Administrators')) {
        $acl.AddAccessRule((New-Object System.Security.AccessControl.FileSystemAccessRule($who, 'FullControl', $inherit, $none, 'Allow')))
    }
    foreach ($who in $Readers) {
        $acl.AddAccessRule((New-Object System.Security.AccessControl.FileSystemAccessRule($who, 'ReadAndExecute', $inherit, $none, 'Allow')))
    }
    foreach ($who in $Writers) {
        $acl.AddAccessRule((New-Object System.Security.AccessControl.FileSystemAccessRule($who, 'Modify', $inherit, $none, 'Allow')))
    }
    Set-Acl -Path $Path -AclObject $acl
}

# -- 2. virtual environment and package ---------------------------------------------------------------
$venv = Join-Path $InstallRoot 'venv'
$venvPython = Join-Path $venv 'Scripts\python.exe'
if (Test-Python $venvPython) {
    Write-Step "reusing $venv"
} else {
    Write-Step "creating $venv"
    Invoke-Native $PythonExe @('-m', 'venv', '--clear', $venv) 'creating the virtual environment'
}
$work = Join-Path $env:TEMP ('se-bridge-install-' + [guid]::NewGuid().ToString('N'))
New-Item -ItemType Directory -Path $work | Out-Null
try {
    $secretsJson = Join-Path $work 'secrets.json'
    if ($SecretsFile) {
        Copy-Item $SecretsFile $secretsJson
    } elseif ($SecretsUri) {
        [IO.File]::WriteAllText($secretsJson, (Get-KeyVaultSecret $SecretsUri $IdentityClientId))
    } elseif ($SecretsB64) {
        [IO.File]::WriteAllBytes($secretsJson, [Convert]::FromBase64String($SecretsB64))
    } else {
        [IO.File]::WriteAllText($secretsJson, '{}')
    }
    $secrets = Get-Content -Raw $secretsJson | ConvertFrom-Json
    $pipArgs = @('-m', 'pip', 'install', '--quiet', '--disable-pip-version-check')
    if ($NoIndex) { $pipArgs += '--no-index' }
    foreach ($dir in $FindLinks) { $pipArgs += @('--find-links', $dir) }
    if (-not $IndexUrl -and ($secrets.PSObject.Properties.Name -contains 'pipIndexUrl')) { $IndexUrl = [string]$secrets.pipIndexUrl }
    if ($IndexUrl) { $pipArgs += @('--index-url', $IndexUrl) }
    if ($Wheel) {
        if ($Wheel -like 'https://*') {
            $name = ([Uri]$Wheel).Segments[-1]
            Invoke-WebRequest -UseBasicParsing -Uri $Wheel -OutFile (Join-Path $work $name)
            $Wheel = Join-Path $work $name
        }
        $Wheel = (Resolve-Path $Wheel).Path
        $target = $Wheel
    } else {
        $target = $Package
    }
    if ($Extras) { $target = "$target[$Extras]" }
    Write-Step "installing $target"
    Invoke-Native $venvPython ($pipArgs + @('--upgrade', $target)) 'pip install'
    if ($Wheel) { Invoke-Native $venvPython ($pipArgs + @('--no-deps', '--force-reinstall', $Wheel)) 'pip install of the wheel' }
    $seBridge = Join-Path $venv 'Scripts\se-bridge.exe'
    $version = & $seBridge --version
    Write-Step "installed $version"

    # -- 3. secrets and configuration (the program is identical to the one in install.sh) ----------
    # The services exist before the ACLs: their virtual accounts (NT SERVICE\<name>) exist only then.
    $hostExe = Join-Path $InstallRoot 'se-bridge-service.exe'
    foreach ($name in $services) {
        if (-not (Get-Service -Name $name -ErrorAction SilentlyContinue)) {
            $sub = $name.Substring('se-bridge-'.Length)
            New-Service -Name $name -BinaryPathName "`"$hostExe`" $sub `"$DataRoot`"" -StartupType Manual `
                -DisplayName "Azure Scheduled Events bridge $sub" | Out-Null
        }
    }
    Set-PrivateAcl $DataRoot @('NT SERVICE\se-bridge-agent', 'NT SERVICE\se-bridge-approver') @()
    Set-PrivateAcl $stateDirs['se-bridge-agent'] @() @('NT SERVICE\se-bridge-agent')
    Set-PrivateAcl $stateDirs['se-bridge-approver'] @() @('NT SERVICE\se-bridge-approver')
    Set-PrivateAcl $logs @() @('NT SERVICE\se-bridge-agent', 'NT SERVICE\se-bridge-approver')
    $settingsPath = ''
    if ($SettingsFile) { $settingsPath = (Resolve-Path $SettingsFile).Path }
    $result = Join-Path $work 'render-result'
    $env:SEB_ROOT = ''; $env:SEB_ETC = $DataRoot; $env:SEB_STATE = $stateDirs['se-bridge-agent']
    $env:SEB_APPROVER_STATE = $stateDirs['se-bridge-approver']; $env:SEB_LOGS = $logs
    $env:SEB_SETTINGS_FILE = $settingsPath; $env:SEB_SETTINGS_B64 = $SettingsB64; $env:SEB_SECRETS = $secretsJson
    $env:SEB_FORCE = if ($ForceConfig) { '1' } else { '0' }; $env:SEB_OWNER = ''; $env:SEB_RESULT = $result
    Invoke-Native $venvPython @('-m', 'bridge.commands.install_config') 'configuration (nothing was changed)'
    $rendered = Get-Content $result | ConvertFrom-StringData
    $approverOn = $rendered.approver -eq '1'
    Write-Step "config $DataRoot\config.toml: $($rendered.config); approver: $(if ($approverOn) { 'enabled' } else { 'disabled' })"

    # -- 4. service host and services --------------------------------------------------------------
    foreach ($name in $services) {
        $svc = Get-Service -Name $name -ErrorAction SilentlyContinue
        if ($svc -and $svc.Status -ne 'Stopped') { Stop-Service -Name $name -Force }
    }
    $hostNew = Join-Path $work 'se-bridge-service.exe'
    Add-Type -TypeDefinition $ServiceHostSource -Language CSharp -OutputAssembly $hostNew -OutputType ConsoleApplication `
        -ReferencedAssemblies 'System.ServiceProcess'
    Copy-Item $hostNew $hostExe -Force
    foreach ($name in $services) {
        # The service host writes errors to the Application log under its own source; a virtual
        # account cannot register one, so the installer does.
        if (-not [Diagnostics.EventLog]::SourceExists($name)) { New-EventLog -LogName Application -Source $name }
        $sub = $name.Substring('se-bridge-'.Length)
        $binPath = "`"$hostExe`" $sub `"$DataRoot`""
        Invoke-Native 'sc.exe' @('config', $name, 'binPath=', $binPath, 'obj=', "NT SERVICE\$name", 'start=', 'delayed-auto') "configuring $name"
        Invoke-Native 'sc.exe' @('failure', $name, 'reset=', '86400', 'actions=', 'restart/5000/restart/5000/restart/5000') "recovery of $name"
        Invoke-Native 'sc.exe' @('failureflag', $name, '1') "recovery flag of $name"
        Invoke-Native 'sc.exe' @('description', $name, 'Forwards Azure IMDS Scheduled Events and relays approvals (scheduled-events-bridge).') "description of $name"
    }
    if ($NoStart) { Write-Step 'services registered, not started (-NoStart)'; return }
    Start-Service -Name 'se-bridge-agent'
    if ($approverOn) {
        Set-Service -Name 'se-bridge-approver' -StartupType Automatic
        Start-Service -Name 'se-bridge-approver'
    } else {
        Set-Service -Name 'se-bridge-approver' -StartupType Disabled
    }
    # Every enabled service must answer /healthz (a wildcard listener is probed on loopback: Windows
    # cannot connect to 0.0.0.0); otherwise the extension fails instead of reporting success.
    & $venvPython -m bridge.commands.install_health (Join-Path $DataRoot 'config.toml') --timeout 60
    if ($LASTEXITCODE -ne 0) {
        foreach ($name in $services) {
            Get-Content (Join-Path $logs "$name.log") -Tail 40 -ErrorAction SilentlyContinue | Write-Host
        }
        throw "se-bridge-install: a service did not become healthy within 60 s (logs above)"
    }
    Write-Step "done: $version"
} finally {
    Remove-Item -Recurse -Force $work -ErrorAction SilentlyContinue
}
