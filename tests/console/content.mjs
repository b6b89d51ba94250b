// Drives the console's content views in a real headless Chromium: an admin unlocks
// the datastore, reads the figures, the hosts and the charts, browses a snapshot
// (clicking through directories, paging a large one), searches it and downloads a
// file; then a backup token bound to another host is refused that snapshot.
// Prints one JSON line of what it saw; tests/it/server.rs checks it.
//
// env: CONSOLE_URL, ADMIN_TOKEN, PASSWORD, SNAPSHOT (to browse), DIRS (the
// directories to click through, "/"-separated, ending in the one with FILE),
// MANY (a directory under the root of DIRS with more than two pages), FILE (a
// file name to download), OTHER_TOKEN (bound to another host), CHROMIUM,
// DOWNLOAD_DIR, SHOT_DIR.
import { drive } from "./drive.mjs";
import fs from "node:fs";

const env = process.env;
const shots = env.SHOT_DIR;
const text = (page, sel) => page.$eval(sel, (e) => e.textContent);

async function signIn(page, token) {
  await page.goto(env.CONSOLE_URL, { waitUntil: "load" });
  await page.waitForSelector("#token", { visible: true });
  await page.type("#token", token);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#who:not([hidden])");
}

// Waits until the directory listing shows `path`'s entries.
async function listed(page, name) {
  await page.waitForFunction(
    (n) => document.querySelector("#crumbs") && document.querySelector("#crumbs").textContent.includes(n) &&
      document.querySelector("#entry-rows tr"),
    {},
    name,
  );
}

await drive(async (browser, out) => {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
  await signIn(page, env.ADMIN_TOKEN);
  await page.waitForSelector("#datastore-rows tr");
  out.key_before = await text(page, "td[data-field=key]");
  // The hosts' note is written once their panel has loaded, after the table.
  await page.waitForFunction(() => (document.querySelector("#hosts-note")?.textContent ?? "") !== "");
  out.hosts_note_locked = await text(page, "#hosts-note");

  // Unlock: a wrong password first (a message, still locked), then the right one.
  await page.click("td[data-field=key] button");
  await page.waitForSelector("#unlock-password", { visible: true });
  await page.type("#unlock-password", "not the password");
  await page.keyboard.press("Enter");
  await page.waitForSelector("#alert:not([hidden])");
  out.wrong_password_alert = await text(page, "#alert");
  await page.type("#unlock-password", env.PASSWORD);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#datastore-rows[data-figures=loaded]", { timeout: 60000 });
  out.figures = await page.$eval("#datastore-rows tr", (r) => {
    const o = {};
    for (const c of r.querySelectorAll("td")) o[c.dataset.field] = c.textContent;
    return o;
  });
  await page.waitForSelector("#snapshot-rows tr");
  out.hosts = await page.$$eval("#host-rows tr", (rows) => rows.map((r) => r.textContent));
  out.snapshot_rows = await page.$$eval("#snapshot-rows tr", (rows) => rows.map((r) => r.dataset.snapshot));
  out.snapshot_text = await page.$$eval("#snapshot-rows tr", (rows) => rows.map((r) => r.textContent));
  out.snapshot_bold = await page.$$eval("#snapshot-rows b", (b) => b.length);
  out.chart_points = await page.$$eval("#chart-occupied circle", (c) => c.length);
  out.chart_label = await page.$eval("#chart-reduction svg", (s) => s.getAttribute("aria-label"));
  // Start a check and watch it finish.
  await page.click("#start-check");
  await page.waitForFunction(
    () => [...document.querySelectorAll("#job-rows tr")].some(
      (r) => r.dataset.job.endsWith("-check-now") && r.querySelector("td[data-field=outcome]").textContent !== ""),
    { timeout: 60000 },
  );
  out.check = await page.$$eval("#job-rows tr", (rows) =>
    rows.filter((r) => r.dataset.job.endsWith("-check-now")).map((r) => ({
      outcome: r.querySelector("td[data-field=outcome]").textContent,
      summary: r.querySelector("td[data-field=summary]").textContent,
    }))[0]);
  if (shots) await page.screenshot({ path: `${shots}/console-overview.png`, fullPage: true });

  // Browse: open the snapshot, click through the directories.
  await page.click(`#snapshot-rows tr[data-snapshot="${env.SNAPSHOT}"] a`);
  await page.waitForSelector("#entry-rows tr");
  const dirs = env.DIRS.split("/").filter((d) => d);
  for (const d of dirs) {
    if (d === dirs[dirs.length - 1]) break;
    await page.click(`#entry-rows tr[data-name="${d}"] th a`);
    await listed(page, d);
  }
  // A large directory comes a page at a time.
  await page.click(`#entry-rows tr[data-name="${env.MANY}"] th a`);
  await listed(page, env.MANY);
  out.many_total = await text(page, "#browse-total");
  out.many_pages = [await page.$$eval("#entry-rows tr", (r) => r.length)];
  while (await page.$eval("#browse-more", (b) => !b.hidden)) {
    const before = await page.$$eval("#entry-rows tr", (r) => r.length);
    await page.click("#browse-more");
    await page.waitForFunction((n) => document.querySelectorAll("#entry-rows tr").length > n, {}, before);
    out.many_pages.push(await page.$$eval("#entry-rows tr", (r) => r.length));
  }
  // Back up one level by the path bar, into the file's directory.
  await page.goBack();
  await page.waitForFunction((n) => !!document.querySelector(`#entry-rows tr[data-name="${n}"]`), {}, dirs[dirs.length - 1]);
  await page.click(`#entry-rows tr[data-name="${dirs[dirs.length - 1]}"] th a`);
  await listed(page, dirs[dirs.length - 1]);
  if (shots) await page.screenshot({ path: `${shots}/console-browse.png`, fullPage: true });

  // Download a file where the test can compare it.
  const cdp = await page.createCDPSession();
  await cdp.send("Browser.setDownloadBehavior", { behavior: "allow", downloadPath: env.DOWNLOAD_DIR });
  await page.click(`#entry-rows tr[data-name="${env.FILE}"] a.download`);
  const target = `${env.DOWNLOAD_DIR}/${env.FILE}`;
  for (let i = 0; i < 300 && !fs.existsSync(target); i++) await new Promise((r) => setTimeout(r, 100));
  out.downloaded = fs.existsSync(target);
  // A download that fails (here a name not in the snapshot) says why above the
  // listing, which stays: the page is not replaced by the server's error.
  await page.$eval(`#entry-rows tr[data-name="${env.FILE}"] a.download`, (a) => {
    a.href = a.href.replace(/path=[^&]*/, "path=" + encodeURIComponent("/no/such/file"));
  });
  await page.click(`#entry-rows tr[data-name="${env.FILE}"] a.download`);
  await page.waitForSelector("#alert:not([hidden])");
  out.download_failed_alert = await text(page, "#alert");
  out.rows_after_failed_download = await page.$$eval("#entry-rows tr", (r) => r.length);

  // Search by name.
  await page.type("#search-text", env.FILE.toUpperCase());
  await page.keyboard.press("Enter");
  await page.waitForSelector("#search-results:not([hidden])");
  out.search = await page.$$eval("#search-list li", (l) => l.map((x) => x.textContent));

  // Sign out.
  await page.click("#sign-out");
  await page.waitForSelector("#token", { visible: true });

  // Another host's backup token: that snapshot is not there for it.
  await signIn(page, env.OTHER_TOKEN);
  await page.waitForSelector("#hosts:not([hidden])");
  await page.goto(`${env.CONSOLE_URL}#snap=${env.SNAPSHOT}&path=/`, { waitUntil: "load" });
  await page.waitForSelector("#alert:not([hidden])");
  out.other_alert = await text(page, "#alert");
  out.other_rows = await page.$$eval("#entry-rows tr", (r) => r.length);
  await page.goto(`${env.CONSOLE_URL}#`, { waitUntil: "load" });
  await page.waitForSelector("#hosts:not([hidden])");
  await page.waitForFunction(() => document.querySelector("#hosts-note").textContent !== "");
  out.other_snapshots = await page.$$eval("#snapshot-rows tr", (rows) => rows.map((r) => r.dataset.snapshot));
  await page.setViewport({ width: 390, height: 800 });
  if (shots) await page.screenshot({ path: `${shots}/console-phone-snapshots.png`, fullPage: true });
});
